//! The plugins' global allocator: a bump arena in `.bss`, then the system allocator.
//!
//! A plugin process lives for about a millisecond and allocates a few hundred kilobytes at
//! most. A general-purpose `malloc` costs it system calls and page faults for nothing: musl's
//! maps and unmaps a page for almost every size class it touches (about 30 `mmap`/`munmap`
//! pairs in one sbr CHECK). Here an allocation is an atomic add on an offset into a static
//! array that the kernel maps lazily (it costs no file size and no memory until touched), and
//! freeing gives memory back only when it is the newest block, which covers the growing
//! buffers of reading stdin and building netlink messages. Whatever does not fit in the arena,
//! such as a huge stdin or the rule listings of a node with thousands of attachments, goes to
//! the system allocator and is freed as usual, so the memory a call can hold for nothing is
//! bounded by [`ARENA_SIZE`].
//!
//! Thread-safe: the bump is a compare-and-swap, with no lock.
//!
//! Installed by [`crate::plugin_main!`] in the plugin binaries only; tests and tools keep the
//! standard allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes in the arena. Above what any plugin call measured here needs (sbr and tuning use
/// tens of kilobytes, firewall and portmap with a thousand attachments a few megabytes).
pub const ARENA_SIZE: usize = 8 << 20;

#[repr(C, align(4096))]
struct Region(UnsafeCell<[u8; ARENA_SIZE]>);

/// A bump arena with the system allocator behind it.
#[derive(Debug)]
pub struct Arena {
    region: Region,
    /// Offset of the first free byte of `region`.
    next: AtomicUsize,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Region")
    }
}

// SAFETY: the bytes of `region` are only reached through pointers that `alloc` hands out, and
// the compare-and-swap on `next` gives each call a range no other live allocation overlaps.
#[allow(unsafe_code)]
unsafe impl Sync for Arena {}

impl Arena {
    /// An empty arena (a `static` initialiser: the zeroed region lands in `.bss`).
    #[must_use]
    pub const fn new() -> Arena {
        Arena {
            region: Region(UnsafeCell::new([0; ARENA_SIZE])),
            next: AtomicUsize::new(0),
        }
    }

    fn base(&self) -> usize {
        self.region.0.get() as usize
    }

    /// Offset of `ptr` in the region, if it is one of the arena's.
    fn offset_of(&self, ptr: *mut u8) -> Option<usize> {
        (ptr as usize)
            .checked_sub(self.base())
            .filter(|&offset| offset < ARENA_SIZE)
    }

    /// Bump-allocates `layout`, or `None` when the arena is too full for it.
    fn bump(&self, layout: Layout) -> Option<*mut u8> {
        let base = self.base();
        let mut current = self.next.load(Ordering::Acquire);
        loop {
            let start = (base + current).checked_next_multiple_of(layout.align())? - base;
            let end = start.checked_add(layout.size())?;
            if end > ARENA_SIZE {
                return None;
            }
            match self
                .next
                .compare_exchange_weak(current, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(self.region.0.get().cast::<u8>().wrapping_add(start)),
                Err(now) => current = now,
            }
        }
    }

    /// Moves the end of the newest block from `old_end` to `new_end`; false when the block is
    /// no longer the newest (or the move does not fit).
    fn resize_newest(&self, old_end: usize, new_end: usize) -> bool {
        new_end <= ARENA_SIZE
            && self
                .next
                .compare_exchange(old_end, new_end, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}

impl Default for Arena {
    fn default() -> Arena {
        Arena::new()
    }
}

// SAFETY: `alloc` returns either a fresh range of the region, aligned and of the requested
// size, that no other live allocation overlaps (see `bump`), or the system allocator's block.
// `dealloc` and `realloc` tell the two apart by address: a system block never lies inside the
// static region. Arena blocks are only reused after `dealloc`/`realloc` moved `next` back over
// them, which happens only for the newest block.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Arena {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.bump(layout) {
            Some(ptr) => ptr,
            // SAFETY: the caller's contract for `layout` is the one `System.alloc` needs.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match self.offset_of(ptr) {
            // Only the newest block can be given back; others stay until the process exits.
            Some(offset) => {
                let _ = self.resize_newest(offset + layout.size(), offset);
            }
            // SAFETY: `ptr` is not in the arena, so `System.alloc` made it, with `layout`.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(offset) = self.offset_of(ptr) else {
            // SAFETY: `ptr` came from `System.alloc` with `layout`; the caller's contract holds.
            return unsafe { System.realloc(ptr, layout, new_size) };
        };
        if self.resize_newest(offset + layout.size(), offset + new_size) {
            return ptr;
        }
        if new_size <= layout.size() {
            return ptr;
        }
        // SAFETY: the caller guarantees `new_size`, rounded up to the alignment, does not
        // overflow `isize`, and the alignment is that of a valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as for `alloc`.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are at least `layout.size()` long and distinct: `new` is a
            // fresh allocation and `ptr` is still live.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size());
                self.dealloc(ptr, layout);
            }
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

    #[allow(unsafe_code)]
    #[test]
    fn blocks_are_aligned_disjoint_and_the_newest_is_given_back() {
        static ARENA: Arena = Arena::new();
        let arena = &ARENA;
        // SAFETY: layouts of non-zero size; every block is freed with its own layout.
        unsafe {
            let a = arena.alloc(layout(3, 1));
            let b = arena.alloc(layout(16, 64));
            assert_eq!(b as usize % 64, 0);
            assert!(b as usize >= a as usize + 3);
            b.write_bytes(0xaa, 16);
            let used = arena.next.load(Ordering::Relaxed);
            arena.dealloc(b, layout(16, 64));
            assert!(
                arena.next.load(Ordering::Relaxed) < used,
                "the newest block comes back"
            );
            let c = arena.alloc(layout(8, 8));
            arena.dealloc(a, layout(3, 1));
            assert!(
                arena.offset_of(c).is_some(),
                "an older block stays allocated"
            );
            arena.dealloc(c, layout(8, 8));
        }
    }

    #[allow(unsafe_code)]
    #[test]
    fn realloc_grows_the_newest_block_in_place_and_copies_older_ones() {
        static ARENA: Arena = Arena::new();
        let arena = &ARENA;
        // SAFETY: as above; contents are only read within the sizes written.
        unsafe {
            let a = arena.alloc(layout(4, 1));
            a.copy_from_nonoverlapping(b"abcd".as_ptr(), 4);
            let grown = arena.realloc(a, layout(4, 1), 100);
            assert_eq!(grown, a, "the newest block grows where it is");
            let _pin = arena.alloc(layout(1, 1));
            let moved = arena.realloc(grown, layout(100, 1), 200);
            assert_ne!(moved, grown);
            assert_eq!(std::slice::from_raw_parts(moved, 4), b"abcd");
        }
    }

    #[allow(unsafe_code)]
    #[test]
    fn what_does_not_fit_comes_from_the_system_and_goes_back_to_it() {
        static ARENA: Arena = Arena::new();
        let arena = &ARENA;
        // SAFETY: as above.
        unsafe {
            let big = arena.alloc(layout(ARENA_SIZE + 1, 8));
            assert!(!big.is_null());
            assert!(arena.offset_of(big).is_none());
            big.write_bytes(1, ARENA_SIZE + 1);
            let small = arena.alloc(layout(10, 1));
            small.copy_from_nonoverlapping(b"0123456789".as_ptr(), 10);
            // Growing past the arena moves the block to the system allocator.
            let moved = arena.realloc(small, layout(10, 1), ARENA_SIZE * 2);
            assert!(arena.offset_of(moved).is_none());
            assert_eq!(std::slice::from_raw_parts(moved, 10), b"0123456789");
            arena.dealloc(moved, layout(ARENA_SIZE * 2, 1));
            arena.dealloc(big, layout(ARENA_SIZE + 1, 8));
        }
    }
}
