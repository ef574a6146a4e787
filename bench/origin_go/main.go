// origin-pool: the origin's in-process keyed worker pool (seed 001) rebuilt in
// Go, as the yardstick of keybus's mem:// targets: 1024 worker goroutines each
// reading its own channel of 1000 *AggregateMessage, FNV-32a of the aggregate
// ID modulo 1024 picks the channel, and ProcessMessage sends with a
// time.After(200 ms) timeout as the origin does. The plan is keybus-bench's:
// aggregate a gets events/aggregates events (the first events%aggregates one
// more), one producer publishing them round by round (mixed: a shuffled order
// per round, keys order-/user-/product-sku-), a 64-byte payload copied into
// each message; the handler checks each aggregate's order and counts. It
// prints one JSON line per run: events/s from the first publish to the last
// handled event and process CPU (getrusage) per event, as keybus-bench's
// rows. Build and run: cd bench/origin_go && go build -o /tmp/origin-go . &&
// /tmp/origin-go -scenario multi -events 1000000.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

type AggregateMessage struct {
	AggregateID string
	Agg         int
	Seq         uint64
	Payload     []byte
}

type KeyedWorkerPool struct {
	workers     []chan *AggregateMessage
	waitTimeout time.Duration
}

var ErrWorkerQueueFull = errors.New("worker queue full")

func NewKeyedWorkerPool(workers, queue int, wait time.Duration, handle func(*AggregateMessage)) *KeyedWorkerPool {
	kp := &KeyedWorkerPool{workers: make([]chan *AggregateMessage, workers), waitTimeout: wait}
	for i := range kp.workers {
		ch := make(chan *AggregateMessage, queue)
		kp.workers[i] = ch
		go func() {
			for m := range ch {
				handle(m)
			}
		}()
	}
	return kp
}

func (kp *KeyedWorkerPool) hashToIndex(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(len(kp.workers)))
}

func (kp *KeyedWorkerPool) ProcessMessage(ctx context.Context, msg *AggregateMessage) error {
	if msg.AggregateID == "" {
		return errors.New("aggregateID required for keyed worker pool")
	}
	ch := kp.workers[kp.hashToIndex(msg.AggregateID)]
	select {
	case ch <- msg:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(kp.waitTimeout):
		return ErrWorkerQueueFull
	}
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func key(scenario string, a int) string {
	if scenario == "mixed" {
		return [...]string{"order-", "user-", "product-sku-"}[a%3] + strconv.Itoa(a)
	}
	return "order-" + strconv.Itoa(a)
}

type result struct {
	Transport       string  `json:"transport"`
	Scenario        string  `json:"scenario"`
	Events          uint64  `json:"events"`
	Aggregates      int     `json:"aggregates"`
	Seconds         float64 `json:"seconds"`
	EventsPerS      float64 `json:"events_per_s"`
	CPUNsPerEvent   float64 `json:"cpu_ns_per_event"`
	OrderViolations uint64  `json:"order_violations"`
	Retries         uint64  `json:"publish_retries"`
}

func run(scenario string, events uint64, aggs int, payloadBytes int) result {
	next := make([]uint64, aggs) // each aggregate is handled by one goroutine only
	var handled, violations uint64
	pool := NewKeyedWorkerPool(1024, 1000, 200*time.Millisecond, func(m *AggregateMessage) {
		if m.Seq != next[m.Agg] {
			atomic.AddUint64(&violations, 1)
		}
		next[m.Agg] = m.Seq + 1
		atomic.AddUint64(&handled, 1)
	})
	keys := make([]string, aggs)
	for a := range keys {
		keys[a] = key(scenario, a)
	}
	payload := make([]byte, payloadBytes)
	count := func(a int) uint64 {
		n := events / uint64(aggs)
		if uint64(a) < events%uint64(aggs) {
			n++
		}
		return n
	}
	rounds := (events + uint64(aggs) - 1) / uint64(aggs)
	order := make([]int, aggs)
	rng := uint64(0x9e3779b97f4a7c15)
	ctx := context.Background()
	var retries uint64
	cpu0, t0 := cpuSeconds(), time.Now()
	for r := uint64(0); r < rounds; r++ {
		n := 0
		for a := 0; a < aggs; a++ {
			if r < count(a) {
				order[n] = a
				n++
			}
		}
		if scenario == "mixed" {
			for i := n; i > 1; i-- {
				rng ^= rng << 13
				rng ^= rng >> 7
				rng ^= rng << 17
				j := int(rng % uint64(i))
				order[i-1], order[j] = order[j], order[i-1]
			}
		}
		for _, a := range order[:n] {
			p := make([]byte, payloadBytes)
			copy(p, payload)
			m := &AggregateMessage{AggregateID: keys[a], Agg: a, Seq: r, Payload: p}
			for pool.ProcessMessage(ctx, m) != nil {
				retries++
			}
		}
	}
	for atomic.LoadUint64(&handled) < events {
		time.Sleep(50 * time.Microsecond)
	}
	secs := time.Since(t0).Seconds()
	cpu := cpuSeconds() - cpu0
	return result{Transport: "baseline:origin-go", Scenario: scenario, Events: events, Aggregates: aggs,
		Seconds: secs, EventsPerS: float64(events) / secs, CPUNsPerEvent: cpu * 1e9 / float64(events),
		OrderViolations: atomic.LoadUint64(&violations), Retries: retries}
}

func main() {
	scenario := flag.String("scenario", "multi", "single | multi | mixed")
	events := flag.Uint64("events", 1000000, "events per run")
	payload := flag.Int("payload-bytes", 64, "bytes per event")
	flag.Parse()
	aggs := map[string]int{"single": 1, "multi": 100, "mixed": 3}[*scenario]
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
