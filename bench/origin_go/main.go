// origin-pool: the origin's in-process keyed worker pool (seed 001) rebuilt in
// Go, as the yardstick of keybus's mem:// targets: 1024 worker goroutines each
// reading its own channel of 1000 *AggregateMessage, FNV-32a of the aggregate
// ID modulo 1024 picks the channel, and ProcessMessage sends with a
// time.After(200 ms) timeout as the origin does (package pool). The plan is
// keybus-bench's: aggregate a gets events/aggregates events (the first
// events%aggregates one more), one producer publishing them round by round
// (mixed: a shuffled order per round, keys order-/user-/product-sku-), a
// 64-byte payload copied into each message; the handler checks each
// aggregate's order and counts. It prints one JSON line per run: events/s from
// the first publish to the last handled event and process CPU (getrusage) per
// event, as keybus-bench's rows. Build and run: cd bench/origin_go && go build
// -o /tmp/origin-go . && /tmp/origin-go -scenario multi -events 1000000.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"keybus/bench/origin_go/pool"
)

func run(scenario string, events uint64, aggs int, payloadBytes int) pool.Result {
	next := make([]uint64, aggs) // each aggregate is handled by one goroutine only
	var handled, violations uint64
	kp := pool.NewKeyedWorkerPool(1024, 1000, 200*time.Millisecond, func(m *pool.AggregateMessage) {
		if m.Seq != next[m.Agg] {
			atomic.AddUint64(&violations, 1)
		}
		next[m.Agg] = m.Seq + 1
		atomic.AddUint64(&handled, 1)
	})
	keys := make([]string, aggs)
	for a := range keys {
		keys[a] = pool.Key(scenario, a)
	}
	payload := make([]byte, payloadBytes)
	ctx := context.Background()
	var retries uint64
	cpu0, t0 := pool.CPUSeconds(), time.Now()
	pool.Plan(scenario, events, aggs, func(a int, seq uint64) {
		p := make([]byte, payloadBytes)
		copy(p, payload)
		m := &pool.AggregateMessage{AggregateID: keys[a], Agg: a, Seq: seq, Payload: p}
		for kp.ProcessMessage(ctx, m) != nil {
			retries++
		}
	})
	for atomic.LoadUint64(&handled) < events {
		time.Sleep(50 * time.Microsecond)
	}
	secs := time.Since(t0).Seconds()
	cpu := pool.CPUSeconds() - cpu0
	return pool.Result{Transport: "baseline:origin-go", Scenario: scenario, Events: events, Aggregates: aggs,
		Seconds: secs, EventsPerS: float64(events) / secs, CPUNsPerEvent: cpu * 1e9 / float64(events),
		OrderViolations: atomic.LoadUint64(&violations), Retries: retries}
}

func main() {
	scenario := flag.String("scenario", "multi", "single | multi | mixed")
	events := flag.Uint64("events", 1000000, "events per run")
	payload := flag.Int("payload-bytes", 64, "bytes per event")
	flag.Parse()
	aggs := pool.Aggregates(*scenario)
	if aggs == 0 {
		fmt.Fprintln(os.Stderr, "origin-pool: -scenario single | multi | mixed")
		os.Exit(2)
	}
	r := run(*scenario, *events, aggs, *payload)
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if r.OrderViolations > 0 {
		os.Exit(1)
	}
}
