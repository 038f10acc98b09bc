//! The plugins' global allocator: size classes in an arena in `.bss`, large blocks and overflow
//! from the system allocator.
//!
//! A plugin process lives for about a millisecond and allocates a few hundred kilobytes in the
//! usual call. A general-purpose `malloc` costs it system calls and page faults for nothing:
//! musl's maps and unmaps a page for almost every size class it touches (about 30
//! `mmap`/`munmap` pairs in one sbr CHECK). Here a small block (up to [`MAX_SMALL`]) comes from
//! a static array that the kernel maps lazily (it costs no file size and no memory until
//! touched): its size is rounded up to a power of two, and it is taken from that size's free
//! list, or else cut from the end of what the arena has handed out so far. A freed block goes
//! back: to the end of the arena when it is the last one cut (the growing buffers of reading
//! stdin and building netlink messages), else onto its size's free list, for the next block of
//! that size. Growing the last block extends it in place; growing another one moves it and
//! frees the old copy. So what a call holds stays within twice what it uses, however often its
//! vectors grow, and a call that decodes a large input reuses the memory of its intermediate
//! values.
//!
//! Large blocks, and small ones once the arena is used up, come from the system allocator and
//! go back to it when freed: both glibc and musl map large blocks on their own and unmap them
//! on free, and grow them with `mremap`, without copying.
//!
//! Thread-safe: a spin lock guards the arena (plugins allocate from at most a few threads, one
//! at a time in practice). Nothing runs between `fork` and `exec` in our children that could
//! find it held.
//!
//! Installed by [`crate::plugin_main!`] in the plugin binaries only; tests and tools keep the
//! standard allocator.
//!
//! # Long-running commands
//!
//! The arena suits a process that ends soon after its last allocation, not one that lives on:
//! memory given back to it is only ever reused for blocks of the same size class (a block
//! freed at the end is the exception), so a process whose allocations change in size over
//! time (a watcher reconciling a hundred attachments, then a thousand, then ten) keeps the
//! blocks of every earlier shape, cut from the region and never merged, until the region is
//! used up and everything goes to the system allocator anyway; and the region's pages, once
//! touched, stay resident for the life of the process. An operator's command
//! ([`crate::operator`]: `reconcile`, and `reconcile --watch`, which runs for days) therefore
//! does not use it: [`Arena::hand_over`], called by [`crate::plugin_main!`] before the first
//! allocation when the command line has arguments, sends every later allocation to the system
//! allocator, which coalesces freed blocks and returns memory to the system. The region then
//! stays untouched and costs nothing (it is `.bss`, mapped lazily). A runtime's call (no
//! arguments) never hands over, and pays one relaxed load per allocation for the choice.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes in the arena. Above what most plugin calls need (sbr and tuning use tens of kilobytes,
/// firewall and portmap with a thousand attachments a few megabytes); calls that need more get
/// it from the system allocator.
pub const ARENA_SIZE: usize = 8 << 20;

/// The largest block the arena serves; larger ones come from the system allocator.
pub const MAX_SMALL: usize = 256 << 10;

/// The smallest block: room for a free list's link, and the alignment of every block.
const MIN_BLOCK: usize = 16;

/// Size classes: `MIN_BLOCK << class` for class 0 ..= `CLASSES - 1`.
const CLASSES: usize = (MAX_SMALL / MIN_BLOCK).trailing_zeros() as usize + 1;

/// The largest alignment the arena serves (a page).
const MAX_ALIGN: usize = 4096;

#[repr(C, align(4096))]
struct Region(UnsafeCell<[u8; ARENA_SIZE]>);

/// What the lock guards.
struct State {
    /// Offset of the first byte of the region never handed out.
    next: usize,
    /// The first free block of each size class; each free block holds the address of the next.
    free: [*mut u8; CLASSES],
}

/// A size-class arena with the system allocator behind it.
pub struct Arena {
    region: Region,
    locked: AtomicBool,
    state: UnsafeCell<State>,
    /// Set by [`Arena::hand_over`]: every allocation from then on is the system allocator's.
    handed_over: AtomicBool,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Arena")
    }
}

// SAFETY: the bytes of `region` are only reached through pointers that `alloc` hands out, one
// live block per range, and `state` only while `locked` is held (see `Guard`).
#[allow(unsafe_code)]
unsafe impl Sync for Arena {}

/// The size class of a block of `size` bytes aligned to `align`, if the arena serves it.
fn class_of(size: usize, align: usize) -> Option<usize> {
    if size > MAX_SMALL || align > MAX_ALIGN {
        return None;
    }
    let block = size.max(align).max(MIN_BLOCK).next_power_of_two();
    Some((block / MIN_BLOCK).trailing_zeros() as usize)
}

fn class_size(class: usize) -> usize {
    MIN_BLOCK << class
}

/// Holds the arena's lock; releases it when dropped.
struct Guard<'a> {
    arena: &'a Arena,
}

impl Guard<'_> {
    fn state(&mut self) -> &mut State {
        // SAFETY: the lock is held for as long as this guard lives, and the guard hands out one
        // mutable borrow at a time.
        #[allow(unsafe_code)]
        unsafe {
            &mut *self.arena.state.get()
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.arena.locked.store(false, Ordering::Release);
    }
}

impl Arena {
    /// An empty arena (a `static` initialiser: the zeroed region lands in `.bss`).
    #[must_use]
    pub const fn new() -> Arena {
        Arena {
            region: Region(UnsafeCell::new([0; ARENA_SIZE])),
            locked: AtomicBool::new(false),
            state: UnsafeCell::new(State {
                next: 0,
                free: [std::ptr::null_mut(); CLASSES],
            }),
            handed_over: AtomicBool::new(false),
        }
    }

    /// Sends every allocation from now on to the system allocator, for a process that will
    /// live long (see the module docs). Blocks the arena handed out before stay valid and
    /// go back to it when freed; one of them grown later moves to the system allocator.
    pub fn hand_over(&self) {
        self.handed_over.store(true, Ordering::Relaxed);
    }

    /// Whether [`Arena::hand_over`] was called.
    fn is_handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Relaxed)
    }

    fn lock(&self) -> Guard<'_> {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // The holder was preempted: let it run.
                std::thread::yield_now();
            }
        }
        Guard { arena: self }
    }

    fn base(&self) -> usize {
        self.region.0.get() as usize
    }

    fn at(&self, offset: usize) -> *mut u8 {
        self.region.0.get().cast::<u8>().wrapping_add(offset)
    }

    /// Offset of `ptr` in the region, if it is one of the arena's.
    fn offset_of(&self, ptr: *mut u8) -> Option<usize> {
        (ptr as usize)
            .checked_sub(self.base())
            .filter(|&offset| offset < ARENA_SIZE)
    }

    /// A block of `class` aligned to `align`: from the free list, else cut from the end;
    /// `None` when the arena is used up.
    fn take(&self, class: usize, align: usize) -> Option<*mut u8> {
        let mut guard = self.lock();
        let state = guard.state();
        let head = state.free[class];
        // Free blocks are aligned to MIN_BLOCK only; larger alignments are cut fresh.
        if !head.is_null() && align <= MIN_BLOCK {
            // SAFETY: a free block is at least MIN_BLOCK bytes, aligned to it, inside the region
            // and owned by the free list, whose link it holds in its first word.
            #[allow(unsafe_code)]
            unsafe {
                state.free[class] = head.cast::<*mut u8>().read();
            }
            return Some(head);
        }
        let base = self.base();
        let start = (base + state.next).checked_next_multiple_of(align.max(MIN_BLOCK))? - base;
        let end = start.checked_add(class_size(class))?;
        if end > ARENA_SIZE {
            return None;
        }
        state.next = end;
        Some(self.at(start))
    }

    /// Gives back the block at `offset` of `class`.
    fn give_back(&self, offset: usize, class: usize) {
        let mut guard = self.lock();
        let state = guard.state();
        if offset + class_size(class) == state.next {
            state.next = offset;
            return;
        }
        let block = self.at(offset);
        // SAFETY: the block is the caller's, no longer used, at least MIN_BLOCK bytes and
        // aligned to it: it now holds the free list's link.
        #[allow(unsafe_code)]
        unsafe {
            block.cast::<*mut u8>().write(state.free[class]);
        }
        state.free[class] = block;
    }

    /// Extends the last block cut, at `offset` of class `from`, to class `to`; false when it is
    /// not the last one or there is no room.
    fn extend_last(&self, offset: usize, from: usize, to: usize) -> bool {
        let mut guard = self.lock();
        let state = guard.state();
        let new_end = offset + class_size(to);
        if offset + class_size(from) != state.next || new_end > ARENA_SIZE {
            return false;
        }
        state.next = new_end;
        true
    }
}

impl Default for Arena {
    fn default() -> Arena {
        Arena::new()
    }
}

// SAFETY: `alloc` returns either a block of the region that no other live allocation overlaps,
// at least as large as the layout's size class and aligned to the layout (a free-list block only
// serves alignments up to MIN_BLOCK, which every block has), or the system allocator's block.
// `dealloc` and `realloc` tell the two apart by address: a system block never lies inside the
// static region. A freed arena block is filed under the size class of the layout it is freed
// with, which is never larger than the block.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !self.is_handed_over()
            && let Some(class) = class_of(layout.size(), layout.align())
            && let Some(ptr) = self.take(class, layout.align())
        {
            return ptr;
        }
        // SAFETY: the caller's contract for `layout` is the one `System.alloc` needs.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match (self.offset_of(ptr), class_of(layout.size(), layout.align())) {
            (Some(offset), Some(class)) => self.give_back(offset, class),
            // SAFETY: `ptr` is not in the arena, so `System.alloc` made it, with `layout`.
            _ => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (Some(offset), Some(from)) =
            (self.offset_of(ptr), class_of(layout.size(), layout.align()))
        else {
            // SAFETY: `ptr` came from `System.alloc` with `layout`; the caller's contract holds.
            return unsafe { System.realloc(ptr, layout, new_size) };
        };
        match class_of(new_size, layout.align()) {
            // It still fits: a smaller size is filed under its smaller class when freed.
            Some(to) if to <= from => return ptr,
            Some(to) if !self.is_handed_over() && self.extend_last(offset, from, to) => {
                return ptr;
            }
            _ => {}
        }
        // SAFETY: the caller guarantees `new_size`, rounded up to the alignment, does not
        // overflow `isize`, and the alignment is that of a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as for `alloc`.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are at least `layout.size()` long and distinct: `new` is a
            // fresh allocation and `ptr` is still live until given back here.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size());
            }
            self.give_back(offset, from);
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A fresh arena on the heap (a `static` per test would do, but 8 MiB each adds up).
    fn arena() -> Box<Arena> {
        // SAFETY: all zeroes is `Arena::new()`: an empty region, an unlocked lock, offset 0,
        // null free lists and no hand-over.
        #[allow(unsafe_code)]
        unsafe {
            let raw = System.alloc_zeroed(Layout::new::<Arena>()).cast::<Arena>();
            assert!(!raw.is_null());
            Box::from_raw(raw)
        }
    }

    fn next(arena: &Arena) -> usize {
        arena.lock().state().next
    }

    #[test]
    fn size_classes_are_powers_of_two_from_sixteen_bytes() {
        assert_eq!(class_of(1, 1), Some(0));
        assert_eq!(class_of(16, 8), Some(0));
        assert_eq!(class_of(17, 8), Some(1));
        assert_eq!(class_of(8, 64), Some(2));
        assert_eq!(class_of(MAX_SMALL, 8), Some(CLASSES - 1));
        assert_eq!(class_size(CLASSES - 1), MAX_SMALL);
        assert_eq!(class_of(MAX_SMALL + 1, 8), None);
        assert_eq!(class_of(8, 8192), None);
    }

    #[allow(unsafe_code)]
    #[test]
    fn blocks_are_aligned_and_disjoint_and_freed_ones_are_reused_by_size() {
        let arena = arena();
        // SAFETY: layouts of non-zero size; every block is freed with its own layout.
        unsafe {
            let a = arena.alloc(layout(3, 1));
            let b = arena.alloc(layout(16, 64));
            assert_eq!(b as usize % 64, 0);
            assert!(b as usize >= a as usize + 16);
            b.write_bytes(0xaa, 16);
            let c = arena.alloc(layout(100, 8));
            let used = next(&arena);
            // Not the last block: onto its class's free list, and reused for the same class.
            arena.dealloc(a, layout(3, 1));
            let d = arena.alloc(layout(10, 8));
            assert_eq!(d, a);
            assert_eq!(next(&arena), used);
            // The last block goes back to the end.
            arena.dealloc(c, layout(100, 8));
            assert!(next(&arena) < used);
            arena.dealloc(d, layout(10, 8));
            arena.dealloc(b, layout(16, 64));
        }
    }

    #[allow(unsafe_code)]
    #[test]
    fn growing_the_last_block_extends_it_and_growing_another_frees_the_old_copy() {
        let arena = arena();
        // SAFETY: as above; contents are only read within the sizes written.
        unsafe {
            let a = arena.alloc(layout(4, 1));
            a.copy_from_nonoverlapping(b"abcd".as_ptr(), 4);
            let grown = arena.realloc(a, layout(4, 1), 100);
            assert_eq!(grown, a, "the last block grows where it is");
            let pin = arena.alloc(layout(1, 1));
            let moved = arena.realloc(grown, layout(100, 1), 200);
            assert_ne!(moved, grown);
            assert_eq!(std::slice::from_raw_parts(moved, 4), b"abcd");
            // The old copy (class of 128 bytes) is free for the next block of its size.
            let reuse = arena.alloc(layout(128, 8));
            assert_eq!(reuse, grown);
            arena.dealloc(reuse, layout(128, 8));
            arena.dealloc(moved, layout(200, 1));
            arena.dealloc(pin, layout(1, 1));
        }
    }

    #[allow(unsafe_code)]
    #[test]
    fn a_vector_grown_many_times_holds_at_most_twice_its_size() {
        let arena = arena();
        // SAFETY: as above; every block is used within its size.
        unsafe {
            // Two vectors growing in turn: neither is ever the last block when it grows.
            let mut blocks = [
                (arena.alloc(layout(8, 8)), 8),
                (arena.alloc(layout(8, 8)), 8),
            ];
            for _ in 0..14 {
                for (ptr, size) in &mut blocks {
                    let pin = arena.alloc(layout(1, 1));
                    *ptr = arena.realloc(*ptr, layout(*size, 8), *size * 2);
                    *size *= 2;
                    ptr.write_bytes(1, *size);
                    arena.dealloc(pin, layout(1, 1));
                }
            }
            let live: usize = blocks.iter().map(|b| b.1).sum();
            assert!(
                next(&arena) <= 2 * live,
                "{} bytes handed out for {live} live",
                next(&arena)
            );
            for (ptr, size) in blocks {
                arena.dealloc(ptr, layout(size, 8));
            }
        }
    }

    #[allow(unsafe_code)]
    #[test]
    fn after_the_hand_over_blocks_come_from_the_system_and_earlier_ones_still_go_back() {
        let arena = arena();
        // SAFETY: as above.
        unsafe {
            let before = arena.alloc(layout(32, 8));
            assert!(arena.offset_of(before).is_some());
            before.copy_from_nonoverlapping(b"0123456789abcdef".as_ptr(), 16);
            let used = next(&arena);
            arena.hand_over();
            let after = arena.alloc(layout(32, 8));
            assert!(
                arena.offset_of(after).is_none(),
                "a small block from the arena"
            );
            // The last block cut is not extended in place any more: it moves out.
            let grown = arena.realloc(before, layout(32, 8), 64);
            assert!(arena.offset_of(grown).is_none());
            assert_eq!(std::slice::from_raw_parts(grown, 16), b"0123456789abcdef");
            assert!(
                next(&arena) < used,
                "the old copy did not go back to the arena"
            );
            arena.dealloc(grown, layout(64, 8));
            arena.dealloc(after, layout(32, 8));
        }
    }

    #[allow(unsafe_code)]
    #[test]
    fn large_blocks_and_overflow_come_from_the_system_and_go_back_to_it() {
        let arena = arena();
        // SAFETY: as above.
        unsafe {
            let big = arena.alloc(layout(MAX_SMALL + 1, 8));
            assert!(!big.is_null());
            assert!(arena.offset_of(big).is_none());
            big.write_bytes(1, MAX_SMALL + 1);
            let small = arena.alloc(layout(10, 1));
            small.copy_from_nonoverlapping(b"0123456789".as_ptr(), 10);
            // Growing past the largest class moves the block to the system allocator.
            let moved = arena.realloc(small, layout(10, 1), ARENA_SIZE * 2);
            assert!(arena.offset_of(moved).is_none());
            assert_eq!(std::slice::from_raw_parts(moved, 10), b"0123456789");
            arena.dealloc(moved, layout(ARENA_SIZE * 2, 1));
            arena.dealloc(big, layout(MAX_SMALL + 1, 8));
            // A full arena hands small blocks to the system allocator too.
            let mut held = Vec::new();
            loop {
                let p = arena.alloc(layout(MAX_SMALL, 8));
                if arena.offset_of(p).is_none() {
                    arena.dealloc(p, layout(MAX_SMALL, 8));
                    break;
                }
                held.push(p);
            }
            assert_eq!(held.len(), ARENA_SIZE / MAX_SMALL);
            for p in held {
                arena.dealloc(p, layout(MAX_SMALL, 8));
            }
        }
    }
}
