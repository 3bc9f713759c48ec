# cycles per 1,000 messages on the consuming instances, from the same trace (usage: python3 cross-instance-hop-cycles.py RUNDIR...; RUNDIR.log is herald-bench's output)
import sys, os, subprocess, collections, re
# summ.py DIR...: per traced run, cycles on the consumer instances during their rows, per 1,000 messages
for d in sys.argv[1:]:
    logs = sorted(os.listdir(d), key=lambda x: int(x.split('.')[0]))
    if len(logs) < 3: continue
    A, B, C = [os.path.join(d, x) for x in logs[:3]]
    head = open(d + '.log').read()
    rows = re.findall(r"syncnet \+ NOTIFY\s+notify\s+(\S+) \(on instance (\d)\)\s+\d+\s+([\d.]+)\s+[\d.]+\s+([\d.]+).*?(\d+)\s+(\d+)\s*$", head, re.M)
    load = re.findall(r"load average: ([\d.]+)", head)
    out = [os.path.basename(d), 'load ' + '→'.join(load[:1] + load[-1:])]
    for tr, inst, p50, p99, busy, oth in rows:
        out.append(f"{tr}@{inst} p50 {p50} p99 {p99} busy {busy}% others {oth}%")
    print(' | '.join(out))
    for name, f, end in (('ws row, instance 2', B, 'F'), ('sse row, instance 3', C, 'P')):
        ev = [l.split() for l in open(f)]
        ts = [int(e[1]) for e in ev if e[0] == end]
        if not ts: continue
        if end == 'P':
            lo, hi = min(ts), min(ts) + 10_000_000  # the sse row: instance 3 pops only for it
        else:
            lo, hi = min(ts), max(ts)
        n = collections.Counter(e[0] for e in ev if lo <= int(e[1]) <= hi)
        msgs = n[end]
        print(f"   {name}: {msgs} msgs; per 1,000 msgs: pre-flights {1000*n['Q']/msgs:.0f}, claims {1000*n['K']/msgs:.0f}, fast pops {1000*n['X']/msgs:.0f}, statements that lease {1000*n['B']/msgs:.0f}")
