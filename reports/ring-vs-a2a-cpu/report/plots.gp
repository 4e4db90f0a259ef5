# Plots of sweep cpu-ring-vs-a2a (written by ulysses-tune report). To redraw: gnuplot plots.gp, run in this directory.
png_terminal = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0 ? 'pngcairo' : 'png'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 1000, 620)
set output 'throughput_vs_seqlen.png'
set title 'Throughput vs sequence length'
set grid
set xlabel 'sequence length (tokens)'
set format x '%.0f'
set logscale x 2
set xrange [3276.8:23040]
set ylabel 'tokens/s per rank'
set yrange [0:1231.98]
set key below
plot 'throughput.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title 'dp=1 sp=4 sp_ring=1', \
     '' index 1 using 1:2 with linespoints lw 2 pt 7 title 'dp=1 sp=4 sp_ring=4'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 1000, 620)
set output 'memory_vs_seqlen.png'
set title 'Peak memory vs sequence length' . "\n" . 'peak above the start-up baseline (resident peak minus 124 MiB, estimated)'
set grid
set xlabel 'sequence length (tokens)'
set format x '%.0f'
set logscale x 2
set xrange [3276.8:40960]
set ylabel 'peak per rank above start-up baseline (GiB)'
set yrange [0:0.542961]
set key below
set arrow from graph 0, first 0.40499999932944775 to graph 1, first 0.40499999932944775 nohead dt 2 lw 2 lc rgb 'red'
set label 'limit 415 MiB per rank' at graph 0.01, first 0.40499999932944775 offset 0,0.7 tc rgb 'red'
plot 'memory.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title 'dp=1 sp=4 sp_ring=1', \
     '' index 1 using 1:2 with linespoints lw 2 pt 7 title 'dp=1 sp=4 sp_ring=4', \
     '' index 2 using 1:2 with points pt 6 ps 1.5 title 'memory probes', \
     '' index 3 using 1:2 with points pt 2 ps 2 lw 2 lc rgb 'red' title 'out of memory'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 900, 620)
set output 'time_breakdown.png'
set title 'Where a step''s time goes'
set grid
set ylabel 'ms per step'
set xlabel 'trial: mesh dp x sp, sequence length'
set xtics rotate by -40
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.75
set yrange [0:13419.6]
set key outside right top
plot 'phases.dat' using 2:xtic(1) title 'compute', '' using 3 title 'comm', '' using 4 title 'offload', '' using 5 title 'optimizer', '' using 6 title 'other'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 1000, 620)
set output 'pareto_front.png'
set title 'Pareto front: sequence length vs throughput'
set grid
set xlabel 'sequence length (tokens)'
set format x '%.0f'
set logscale x 2
set xrange [3276.8:23040]
set ylabel 'tokens/s per rank'
set yrange [0:1231.98]
set key below
plot 'pareto.dat' index 0 using 1:2 with points pt 6 ps 1.3 lc rgb 'gray50' title 'measured trials', \
     '' index 1 using 1:2 with linespoints lw 2 pt 7 ps 1.6 lc rgb 'red' title 'Pareto front (longer and faster is better; trials in the table below)'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 920, 620)
set output 'prediction_error.png'
set title 'Cost model: predicted vs measured, error per trial'
set grid
set datafile missing '?'
set ylabel '(predicted - measured) / measured, %'
set xlabel 'ok trial: mesh dp x sp, sequence length'
set xtics rotate by -40
set key below horizontal
set grid ytics
set xrange [-0.6:11.6]
set yrange [-45.3439:67.942]
set arrow from graph 0, first 10 to graph 1, first 10 nohead dt 2 lc rgb 'blue'
set arrow from graph 0, first -10 to graph 1, first -10 nohead dt 2 lc rgb 'blue'
set arrow from graph 0, first 20 to graph 1, first 20 nohead dt 2 lc rgb 'red'
set arrow from graph 0, first -20 to graph 1, first -20 nohead dt 2 lc rgb 'red'
plot 'prediction.dat' using 0:2:xtic(1) with points pt 7 ps 1.5 lc rgb 'blue' title 'peak memory above baseline (band +-10 %)', \
     '' using 0:3 with points pt 5 ps 1.5 lc rgb 'red' title 'step time (band +-20 %)'

set output
