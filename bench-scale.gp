# Written by the bench (bench/src/report.rs) with bench-scale.dat; run: gnuplot bench-scale.gp
set terminal pngcairo size 1500,920 font 'sans,10'
set output 'bench-scale.png'
set datafile missing '-'
set linetype 1 lc rgb '#1b9e77' lw 2 pt 7
set linetype 2 lc rgb '#7570b3' lw 2 pt 5
set linetype 3 lc rgb '#d95f02' lw 2 pt 9
set linetype 4 lc rgb '#666666' lw 2 pt 13
set logscale xy
set grid
set key bmargin center horizontal
set bmargin 5
set xrange [5:10000]
set xtics ("0" 10, "100" 100, "500" 500, "1000" 1000, "5000" 5000)
set xlabel 'other attachments installed'
set multiplot layout 2,3 title 'With N others installed: one more ADD and DEL (median, bars to p90), and the time to install the N'
set ylabel 'ms'
set title 'firewall: ADD of one more'
plot 'bench-scale.dat' index 0 using 2:3:3:4 with yerrorlines lt 2 title 'ours iptables', \
     'bench-scale.dat' index 1 using 2:3:3:4 with yerrorlines lt 1 title 'ours nftables', \
     'bench-scale.dat' index 2 using 2:3:3:4 with yerrorlines lt 3 title 'Go iptables'
set ylabel 'ms'
set title 'firewall: DEL of one more'
plot 'bench-scale.dat' index 0 using 2:5:5:6 with yerrorlines lt 2 title 'ours iptables', \
     'bench-scale.dat' index 1 using 2:5:5:6 with yerrorlines lt 1 title 'ours nftables', \
     'bench-scale.dat' index 2 using 2:5:5:6 with yerrorlines lt 3 title 'Go iptables'
set ylabel 's'
set title 'firewall: installing the N others (total)'
plot 'bench-scale.dat' index 0 using 2:7 with linespoints lt 2 title 'ours iptables', \
     'bench-scale.dat' index 1 using 2:7 with linespoints lt 1 title 'ours nftables', \
     'bench-scale.dat' index 2 using 2:7 with linespoints lt 3 title 'Go iptables'
set ylabel 'ms'
set title 'portmap: ADD of one more'
plot 'bench-scale.dat' index 3 using 2:3:3:4 with yerrorlines lt 1 title 'ours nftables', \
     'bench-scale.dat' index 4 using 2:3:3:4 with yerrorlines lt 2 title 'ours iptables', \
     'bench-scale.dat' index 5 using 2:3:3:4 with yerrorlines lt 3 title 'Go iptables'
set ylabel 'ms'
set title 'portmap: DEL of one more'
plot 'bench-scale.dat' index 3 using 2:5:5:6 with yerrorlines lt 1 title 'ours nftables', \
     'bench-scale.dat' index 4 using 2:5:5:6 with yerrorlines lt 2 title 'ours iptables', \
     'bench-scale.dat' index 5 using 2:5:5:6 with yerrorlines lt 3 title 'Go iptables'
set ylabel 's'
set title 'portmap: installing the N others (total)'
plot 'bench-scale.dat' index 3 using 2:7 with linespoints lt 1 title 'ours nftables', \
     'bench-scale.dat' index 4 using 2:7 with linespoints lt 2 title 'ours iptables'
unset multiplot
