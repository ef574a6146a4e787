#!/bin/sh
# Plots for docs/benchmarks.md from the JSON lines and CDF data of run-all.sh.
# usage: bench/plot.sh RESULTS_DIR IMG_DIR
set -eu
res=$1
img=$2
mkdir -p "$img"

# One data file per transport: "events events_per_s rss_MB" (or "threads ...").
series() {   # kind xfield transport -> file
    jq -r --arg k "$1" --arg t "$3" \
        'select(.kind == $k and .transport == $t) | "\(.'"$2"') \(.events_per_s) \(.rss_bytes / 1048576)"' \
        "$res/results.jsonl"
}
for t in baseline:ring baseline:mutex mem://; do
    f=$(echo "$t" | tr -c 'a-z0-9\n' '_')
    series sweep-events events "$t" >"$res/events_$f.dat"
    series sweep-threads threads "$t" >"$res/threads_$f.dat"
done

gnuplot <<GP
set terminal pngcairo size 900,540 font "sans,11" noenhanced
set grid
set key top left

set output "$img/throughput_vs_events.png"
set title "Throughput against events (multi: 100 aggregates, 1 producer)"
set logscale x
set format x "%.0s%c"
set xlabel "events per run"
set ylabel "events/s"
set format y "%.1s%c"
plot "$res/events_baseline_ring.dat" using 1:2 with linespoints title "baseline:ring", \
     "$res/events_baseline_mutex.dat" using 1:2 with linespoints title "baseline:mutex", \
     "$res/events_mem___.dat" using 1:2 with linespoints lw 2 title "keybus mem://"

set output "$img/rss_vs_events.png"
set title "Peak RSS against events (multi: 100 aggregates)"
set ylabel "peak RSS, MiB"
set format y "%g"
plot "$res/events_baseline_ring.dat" using 1:3 with linespoints title "baseline:ring", \
     "$res/events_baseline_mutex.dat" using 1:3 with linespoints title "baseline:mutex", \
     "$res/events_mem___.dat" using 1:3 with linespoints lw 2 title "keybus mem://"

set output "$img/throughput_vs_threads.png"
set title "Throughput against executor threads (multi, 1M events, 1 producer)"
unset logscale x
set format x "%g"
set xlabel "threads (pool.threads; mutex workers; ring always 1 consumer)"
set ylabel "events/s"
set xtics 1
set format y "%.1s%c"
plot "$res/threads_baseline_ring.dat" using 1:2 with linespoints title "baseline:ring", \
     "$res/threads_baseline_mutex.dat" using 1:2 with linespoints title "baseline:mutex", \
     "$res/threads_mem___.dat" using 1:2 with linespoints lw 2 title "keybus mem://"

set output "$img/latency_cdf.png"
set title "Publish-to-handle latency CDF at a fixed offered load of 1M events/s (multi)"
set logscale x
set format x "%g"
set xtics autofreq   # the threads plot's "xtics 1" on a log axis left it without numbers
set mxtics 10
set xlabel "latency, us (log)"
set ylabel "fraction of events handled within"
set format y "%g"
set yrange [0:1]
set key bottom right
titles = system("grep '^# ' '$res/cdf.dat' | awk '{print \$3}'")
n = words(titles) > 3 ? 3 : words(titles)   # the first repeat: ring, mutex, keybus
plot for [i=1:n] "$res/cdf.dat" index (i-1) using 1:2 with lines lw 2 title word(titles, i)
GP

# One latency CDF per broker: its raw client and keybus at each offered rate (the first of
# the repeats), from run-all.sh's cdf-BROKER-RATE.dat. Skipped for a broker not run.
for broker in redis nats; do
    files=""
    for rate in 1000 10000 50000; do   # run-all.sh's points, in order
        if [ -s "$res/cdf-$broker-$rate.dat" ]; then files="$files $res/cdf-$broker-$rate.dat"; fi
    done
    [ -n "$files" ] || continue
    gnuplot <<GP
set terminal pngcairo size 900,620 font "sans,11" noenhanced
set grid xtics mxtics ytics
set output "$img/latency_cdf_$broker.png"
set title "$broker: publish-to-handle latency CDF at fixed offered loads (multi, 100 aggregates)"
set logscale x
set xtics ("10 µs" 10, "100 µs" 100, "1 ms" 1000, "10 ms" 10000, "100 ms" 100000, "1 s" 1000000, "10 s" 10000000)
set mxtics 10
set xlabel "publish-to-handle latency (log)"
set ylabel "fraction of events handled within"
set yrange [0:1]
set ytics 0.1
set key outside below maxrows 3 width 2
files = "$(echo $files)"
label(f, i) = system("grep '^# ' '" . f . "' | sed -n " . i . "p | awk '{sub(/events=.* rate=/, \"\"); print \$3 \" @ \" \$4 \"/s\"}'")
# one colour per rate: the raw client dashed, keybus solid
plot for [i=1:words(files)] word(files, i) index 0 using 1:2 with lines lw 2 dt 2 lc i title label(word(files, i), 1), \
     for [i=1:words(files)] word(files, i) index 1 using 1:2 with lines lw 2 lc i title label(word(files, i), 2)
GP
done
