#!/bin/bash
# How the figures in ../statements-cut-postgres-cpu-per-statement.txt section 2 were taken: a PostgreSQL
# 15 on port 55611 (socket dir /tmp/i36pg, log to /tmp/i36pg/pglog, stderr logging) holding a migrated
# herald schema and a queue with one partition whose id is in /tmp/i36/bp.txt. Usage: ./measure.sh full.sql 3000
f=$1; N=$2; PID=$(cat /tmp/i36/bp.txt)
: > /tmp/i36pg/pglog
PGOPTIONS='-c synchronous_commit=off -c plan_cache_mode=force_generic_plan -c search_path=herald -c log_statement_stats=on' /usr/lib/postgresql/15/bin/pgbench -h 127.0.0.1 -p 55611 -U postgres -n -M prepared -t $N -f $f -D "pid={$PID}" -D 'pay={"{\"t\":1}"}' -D 'nul={NULL}' -D 'e={}' herald >/dev/null 2>&1
python3 - "$f" <<'PY'
import re,sys,collections
txt=open('/tmp/i36pg/pglog').read()
pat=re.compile(r'LOG:  (\w+) MESSAGE STATISTICS\n.*?DETAIL:  ! system usage stats:\n\s*!\s*([\d.]+) s user, ([\d.]+) s system.*?STATEMENT:  (.{0,30})', re.S)
agg=collections.defaultdict(lambda:[0,0.0])
for m in pat.finditer(txt):
    k=(m.group(4)[:12], m.group(1))
    a=agg[k]; a[0]+=1; a[1]+=float(m.group(2))+float(m.group(3))
out=[]
for k,(n,c) in sorted(agg.items()):
    if n>100: out.append(f'{k[0][:28]} {k[1]}: {c*1e6/n:.1f}us')
print(sys.argv[1], ' | '.join(out))
PY
