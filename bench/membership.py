#!/usr/bin/env python3
"""The analysis half of scripts/bench-membership.sh (keybus-membership runs
the processes). Times are CLOCK_MONOTONIC seconds (time.monotonic() here).

  membership.py stream TOPIC                    the JetStream stream of TOPIC
  membership.py leader STREAM HTTP_PORT...      index of the node leading STREAM
  membership.py bystander STREAM HTTP_PORT...   a node leading no stream (nor the
                                                meta group when one is free)
  membership.py consumers STREAM OUT HTTP_PORT...
        poll /jsz every 0.25 s until killed: "time name" per consumer of
        STREAM first seen
  membership.py check RESULT PARTITIONS SUMMARY MARKS [CONSUMERS] -- LOG...
        lost, order, duplicates, pauses of one run: printed, and as JSON in RESULT
  membership.py row LABEL RESULT...             the Markdown row of several runs
"""
import http.client
import json
import statistics
import sys
import time
import urllib.request


def fnv1a32(s):
    h = 0x811C9DC5
    for b in s.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def partition(key, parts):
    """kb_partition_of: every transport routes a key by it."""
    return fnv1a32(key) % parts if parts > 1 else 0


def stream_of(topic):
    """KB_<topic, '.' as '_'>_<fnv1a32(topic), 8 hex> (docs/transports-nats.md)."""
    return "KB_%s_%08x" % (topic.replace(".", "_"), fnv1a32(topic))


def jsz(port, what):
    """A node killed while it answers cuts its reply short: that is an OSError
    to every caller, as a node that does not answer at all."""
    url = "http://127.0.0.1:%s/jsz?%s" % (port, what)
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.load(r)
    except (http.client.HTTPException, ValueError) as e:
        raise OSError(str(e)) from e


def streams(ports):
    """(server_name, meta leader, {stream: leader}) from the first node that answers."""
    for p in ports:
        try:
            d = jsz(p, "streams=true")
        except OSError:
            continue
        leaders = {}
        for acc in d.get("account_details", []):
            for s in acc.get("stream_detail", []):
                leaders[s["name"]] = s.get("cluster", {}).get("leader")
        return d.get("meta_cluster", {}).get("leader"), leaders
    return None, {}


def node_index(name):
    return int(name[1:]) if name and name[0] == "n" and name[1:].isdigit() else -1


def cmd_leader(stream, ports):
    for _ in range(150):
        _, leaders = streams(ports)
        if leaders.get(stream):
            print(node_index(leaders[stream]))
            return 0
        time.sleep(0.1)
    print("no leader of %s" % stream, file=sys.stderr)
    return 1


def cmd_bystander(stream, ports):
    for _ in range(150):
        meta, leaders = streams(ports)
        if leaders.get(stream):
            break
        time.sleep(0.1)
    busy = set(leaders.values())
    nodes = ["n%d" % i for i in range(len(ports))]
    for pick in ([n for n in nodes if n not in busy and n != meta], [n for n in nodes if n not in busy],
                 [n for n in nodes if n != leaders.get(stream) and n != leaders.get("KV_keybus_leases")]):
        if pick:
            leads = sorted(s for s, l in leaders.items() if l == pick[0])
            print("%s leads %s%s" % (pick[0], ", ".join(leads) or "no stream",
                                     " and the meta group" if pick[0] == meta else ""),
                  file=sys.stderr)
            print(node_index(pick[0]))
            return 0
    return 1


def cmd_consumers(stream, out, ports):
    """Each consumer of the stream when first seen, in OUT; each change of a
    consumer's leader (as the first node that answers sees it) in OUT.leaders,
    so a pause can be laid beside the consumer elections."""
    seen = set()
    leader = {}
    with open(out, "a") as f, open(out + ".leaders", "a") as fl:
        while True:
            for p in ports:
                try:
                    d = jsz(p, "consumers=true")
                except OSError:
                    continue
                for acc in d.get("account_details", []):
                    for s in acc.get("stream_detail", []):
                        if s["name"] != stream:
                            continue
                        for c in s.get("consumer_detail", []) or []:
                            now = time.monotonic()
                            if c["name"] not in seen:
                                seen.add(c["name"])
                                f.write("%.4f %s\n" % (now, c["name"]))
                                f.flush()
                            lead = (c.get("cluster") or {}).get("leader") or "-"
                            if leader.get(c["name"]) != lead:
                                leader[c["name"]] = lead
                                fl.write("%.4f %s %s\n" % (now, c["name"], lead))
                                fl.flush()
                break
            time.sleep(0.25)


def read_kv(path):
    out = {}
    for line in open(path):
        f = line.split()
        if f:
            out[f[0]] = f[1:]
    return out


def cmd_check(result, parts, summary, marks, consumers, logs):
    s = read_kv(summary)
    published = int(s["published"][0])
    first, last = float(s["first"][0]), float(s["last"][0])
    mk = [(float(t), what) for t, what in (l.split(None, 1) for l in open(marks) if l.strip())]
    events = []
    for log in logs:
        for line in open(log):
            f = line.split()
            if len(f) == 5:
                events.append((float(f[0]), f[1], int(f[2]), partition(f[1], parts), f[3]))
    events.sort()
    # per key: a sequence is new (last + 1), a duplicate (at most the last)
    # or a violation (a gap: an event handled before one published earlier)
    lastseq, seen, dups, violations, last_new = {}, set(), 0, 0, first
    owner, changes, moved = {}, 0, set()
    handled_at = {p: [] for p in range(parts)}
    for t, key, seq, part, name in events:
        prev = lastseq.get(key, 0)
        if seq == prev + 1:
            lastseq[key] = seq
            last_new = t
        elif seq <= prev:
            dups += 1
        else:
            violations += 1
            lastseq[key] = seq
        seen.add((key, seq))
        if part < parts:
            handled_at[part].append(t)
            if owner.get(part, name) != name and t >= mk[0][0] - 1:
                changes += 1
                moved.add(part)
            owner[part] = name
    nkeys = int(s["keys"][0])
    lost = 0
    for i in range(published):
        if ("k%d" % (i % nkeys), i // nkeys + 1) not in seen:
            lost += 1
    # a partition's pause: the longest gap between two of its handled events
    # (from the first mark less 1 s: start-up is not a membership change) that
    # reaches into the time the producer was publishing
    since = max(first, mk[0][0] - 1) if mk else first
    pauses = []
    for p in range(parts):
        prev, worst, at = since, 0.0, since
        for t in handled_at[p]:
            if t < since:
                continue
            if t - prev > worst:
                worst, at = t - prev, prev
            prev = t
            if t > last:
                break
        if prev < last and last - prev > worst:   # never handled again
            worst, at = float("inf"), prev
        pauses.append((worst, p, at))
    pauses.sort(reverse=True)
    # partitions no process took from another after the change: a membership
    # change should not pause them at all
    kept = [x for x in pauses if x[1] not in moved]
    last_handled = last_new - last   # the last event handled the first time
    drain = s.get("drain", ["-1", str(last)])
    flush = s.get("flush", ["-1", str(last)])
    created = None
    if consumers:
        t0 = mk[0][0] if mk else first
        created = sum(1 for l in open(consumers) if l.split() and float(l.split()[0]) >= t0)
    ends = {}
    for t, _, _, part, name in events:
        if t >= last - 2 and t <= last + 0.5:
            ends.setdefault(part, set()).add(name)
    r = {"published": published, "handled": len(events), "lost": lost, "order": violations,
         "dups": dups, "pause": pauses[0][0], "pause_part": pauses[0][1],
         "pause_at": pauses[0][2] - mk[0][0] if mk else 0.0,
         "over2": sum(1 for p in pauses if p[0] > 2),
         "pause_kept": kept[0][0] if kept else 0.0, "kept": len(kept), "last_handled": last_handled,
         "drain_rc": int(drain[0]), "drain": float(drain[1]) - last, "flush_rc": int(flush[0]),
         "owner_changes": changes, "consumers_created": created,
         "owned_at_end_by_two": sum(1 for v in ends.values() if len(v) > 1)}
    json.dump(r, open(result, "w"))
    for t, what in mk:
        print("  mark %+8.3f s %s" % (t - mk[0][0], what.strip()))
    print("  published %d, handled %d: lost %d, order violations %d, duplicates %d" %
          (published, len(events), lost, violations, dups))
    print("  longest pause %.2f s (partition %d, from %+.2f s after the first mark); %d of %d "
          "partitions paused over 2 s; the five longest: %s" %
          (r["pause"], r["pause_part"], r["pause_at"], r["over2"], parts,
           ", ".join("p%d %.2f" % (p, w) for w, p, _ in pauses[:5])))
    if kept and moved:
        print("  partitions that kept their owner: %d, the longest pause of one %.2f s (p%d)" %
              (len(kept), kept[0][0], kept[0][1]))
    print("  kb_flush %d, kb_drain %d %.2f s after the last publish; last handled %.2f s after it"
          % (r["flush_rc"], r["drain_rc"], r["drain"], last_handled))
    print("  partition owner changes %d%s; partitions handled by two processes in the last 2 s: %d"
          % (changes, "" if created is None else ", consumers created %d" % created,
             r["owned_at_end_by_two"]))
    return 0


def cmd_row(label, results):
    rs = [json.load(open(p)) for p in results]
    if not rs:
        return 1

    def mw(k, fmt="%.1f"):
        v = [r[k] for r in rs]
        return "%s / %s" % (fmt % statistics.median(v), fmt % max(v))

    created = [r for r in rs if r.get("consumers_created") is not None]
    ratio = "—"
    if created:
        ratio = ", ".join("%d/%d" % (r["consumers_created"], r["owner_changes"]) for r in created)
    print("| %s | %d | %s | %s | %s | %d | %d | %d | %s |" %
          (label, len(rs), mw("pause"), mw("drain"), mw("last_handled"),
           sum(r["lost"] for r in rs), sum(r["order"] for r in rs),
           max(r["dups"] for r in rs), ratio))
    return 0


def main(a):
    if len(a) == 2 and a[0] == "stream":
        print(stream_of(a[1]))
        return 0
    if len(a) >= 3 and a[0] == "leader":
        return cmd_leader(a[1], a[2:])
    if len(a) >= 3 and a[0] == "bystander":
        return cmd_bystander(a[1], a[2:])
    if len(a) >= 4 and a[0] == "consumers":
        return cmd_consumers(a[1], a[2], a[3:])
    if len(a) >= 7 and a[0] == "check" and "--" in a:
        i = a.index("--")
        head = a[1:i]
        return cmd_check(head[0], int(head[1]), head[2], head[3], head[4] if len(head) > 4 else None,
                         a[i + 1:])
    if len(a) >= 3 and a[0] == "row":
        return cmd_row(a[1], a[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
