# Plots of sweep quickstart-qwen3-cpu (written by ulysses-tune report). To redraw: gnuplot plots.gp, run in this directory.
png_terminal = strstrt(GPVAL_TERMINALS, 'pngcairo') > 0 ? 'pngcairo' : 'png'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 1000, 620)
set output 'throughput_vs_seqlen.png'
set title 'Throughput vs sequence length'
set grid
set xlabel 'sequence length (tokens)'
set format x '%.0f'
set logscale x 2
set xrange [614.4:9280]
set ylabel 'tokens/s per rank'
set yrange [0:2887.92]
set key below
plot 'throughput.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title 'dp=4 sp=1 tiled_loss=8 offload=activations', \
     '' index 1 using 1:2 with linespoints lw 2 pt 7 title 'dp=2 sp=2 tiled_loss=8 offload=activations', \
     '' index 2 using 1:2 with linespoints lw 2 pt 7 title 'dp=1 sp=4 tiled_loss=8 offload=activations', \
     '' index 3 using 1:2 with linespoints lw 2 pt 7 title 'dp=1 sp=4 tiled_loss=8 offload=none'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 1000, 620)
set output 'memory_vs_seqlen.png'
set title 'Peak memory vs sequence length' . "\n" . 'peak above the start-up baseline (resident peak minus 0.12 GiB, estimated)'
set grid
set xlabel 'sequence length (tokens)'
set format x '%.0f'
set logscale x 2
set xrange [204.8:15360]
set ylabel 'peak per rank above start-up baseline (GiB)'
set yrange [0:0.07056]
set key below
set arrow from graph 0, first 0.06299999915063381 to graph 1, first 0.06299999915063381 nohead dt 2 lw 2 lc rgb 'red'
set label 'limit 0.06 GiB per rank' at graph 0.01, first 0.06299999915063381 offset 0,0.7 tc rgb 'red'
plot 'memory.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title 'dp=4 sp=1 tiled_loss=8 offload=activations', \
     '' index 1 using 1:2 with linespoints lw 2 pt 7 title 'dp=2 sp=2 tiled_loss=8 offload=activations', \
     '' index 2 using 1:2 with linespoints lw 2 pt 7 title 'dp=1 sp=4 tiled_loss=8 offload=activations', \
     '' index 3 using 1:2 with linespoints lw 2 pt 7 title 'dp=1 sp=4 tiled_loss=8 offload=none', \
     '' index 4 using 1:2 with points pt 6 ps 1.5 title 'memory probes', \
     '' index 5 using 1:2 with points pt 2 ps 2 lw 2 lc rgb 'red' title 'out of memory'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 1120, 620)
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
set yrange [0:4442.83]
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
set xrange [614.4:9280]
set ylabel 'tokens/s per rank'
set yrange [0:2887.92]
set key below
plot 'pareto.dat' index 0 using 1:2 with points pt 6 ps 1.3 lc rgb 'gray50' title 'measured trials', \
     '' index 1 using 1:2 with linespoints lw 2 pt 7 ps 1.6 lc rgb 'red' title 'Pareto front (longer and faster is better; trials in the table below)'

reset
eval sprintf('set terminal %s noenhanced size %d,%d', png_terminal, 1880, 620)
set output 'prediction_error.png'
set title 'Cost model: predicted vs measured, error per trial'
set grid
set datafile missing '?'
set ylabel '(predicted - measured) / measured, %'
set xlabel 'ok trial: mesh dp x sp, sequence length'
set xtics rotate by -40
set key below horizontal
set grid ytics
set xrange [-0.6:27.6]
set yrange [-101.945:34.4033]
set arrow from graph 0, first 10 to graph 1, first 10 nohead dt 2 lc rgb 'blue'
set arrow from graph 0, first -10 to graph 1, first -10 nohead dt 2 lc rgb 'blue'
set arrow from graph 0, first 20 to graph 1, first 20 nohead dt 2 lc rgb 'red'
set arrow from graph 0, first -20 to graph 1, first -20 nohead dt 2 lc rgb 'red'
plot 'prediction.dat' using 0:2:xtic(1) with points pt 7 ps 1.5 lc rgb 'blue' title 'peak memory above baseline (band +-10 %)', \
     '' using 0:3 with points pt 5 ps 1.5 lc rgb 'red' title 'step time (band +-20 %)'

set output
