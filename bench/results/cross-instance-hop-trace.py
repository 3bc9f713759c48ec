import sys, bisect, collections
def load(path):
    ev = collections.defaultdict(list)
    for line in open(path):
        parts = line.rstrip('\n').split(' ', 2)
        if len(parts) < 2: continue
        e, t = parts[0], int(parts[1]); k = parts[2] if len(parts) > 2 else ''
        ev[e].append((t, k))
    return ev
A = load(sys.argv[1]); B = load(sys.argv[2]); end = sys.argv[3] if len(sys.argv) > 3 else 'F'
commit = {}; part = {}
for t, k in A['C']:
    tx, p = k.split(' ', 1); commit[tx] = t; part[tx] = p
def bykey(lst):
    d = collections.defaultdict(list)
    for t, k in lst: d[k].append(t)
    for v in d.values(): v.sort()
    return d
S = bykey(A['S']); R = bykey(B['R']); W = bykey(B['W'])
Y = sorted(t for t, _ in B['Y'])
PATH = sorted([(t,'fast') for t,_ in B['X']]+[(t,'preflight') for t,_ in B['Q']]+[(t,'claim') for t,_ in B['K']])
PATHT=[t for t,_ in PATH]; BB = sorted(t for t, _ in B['B'])
P = {}
for t, k in B['P']:
    P.setdefault(k, t)
Fm = {}
for t, k in B[end]:
    Fm.setdefault(k, t)
def first_ge(lst, x):
    i = bisect.bisect_left(lst, x)
    return lst[i] if i < len(lst) else None
def last_le(lst, x):
    i = bisect.bisect_right(lst, x)
    return lst[i-1] if i else None
stages = collections.defaultdict(list); early = 0; n = 0
txs = sorted(Fm, key=lambda k: Fm[k])
skip = int(len(txs) * 0.2)  # warm-up, as the bench: first 2 of 10 s
for tx in txs[skip:]:
    if tx not in commit: continue
    c = commit[tx]; p = part[tx]; f = Fm[tx]; pp = P.get(tx, f)
    s = first_ge(S.get(p, []), c); 
    if s is None: continue
    r = first_ge(R.get(p, []), c)
    w = first_ge(W.get(p, []), r) if r else None
    n += 1
    stages['total commit->end'].append(f - c)
    stages['push commit->datagram sent'].append(s - c)
    if r is None or w is None or r > pp:
        early += 1
        stages['commit->pop returned'].append(pp - c)
        stages['pop returned->end'].append(f - pp)
        continue
    y = first_ge(Y, w); b = first_ge(BB, y) if y else None
    stages['commit->recv (send+udp)'].append(r - c)
    stages['recv->poller.Wake (limiter)'].append(w - r)
    if y is not None and y <= pp:
        stages['Wake->cycle start'].append(y - w)
        if b is not None and b <= pp:
            stages['cycle start->pop sent'].append(b - y)
            stages['pop round trip'].append(pp - b)
        else:
            stages['cycle start->pop returned'].append(pp - y)
    else:
        stages['Wake->pop returned(other cycle)'].append(pp - w)
    stages['commit->pop returned'].append(pp - c)
    stages['pop returned->end'].append(f - pp)
    bb = last_le(BB, pp)
    if bb is not None:
        i = bisect.bisect_right(PATHT, bb)
        kind = PATH[i-1][1] if i else '?'
        stages['path '+kind+': commit->end'].append(f - c)
        stages['path '+kind+': pop RT'].append(pp - bb)
        j = bisect.bisect_right(Y, PATH[i-1][0]) if i else 0
        if j: stages['path '+kind+': cycle start->pop sent'].append(bb - Y[j-1])
def pct(v, q):
    v = sorted(v); return v[min(len(v)-1, int(q*len(v)))]
print(f"messages {n}, popped before their own datagram's wake {early}")
print(f"{'stage (µs)':38s} {'n':>6s} {'p50':>7s} {'p90':>7s} {'p99':>7s} {'max':>7s} {'mean':>7s}")
for k, v in stages.items():
    print(f"{k:38s} {len(v):6d} {pct(v,.5):7d} {pct(v,.9):7d} {pct(v,.99):7d} {max(v):7d} {sum(v)//len(v):7d}")
