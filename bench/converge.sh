#!/usr/bin/env bash
# Benchmark: site.yml first converge and idempotent second converge, through the
# CAPI inventory, on fresh lab machines, and beside them an empty play on the same
# hosts (one ping each, through the same inventory): the floor a second converge is
# compared with. Default: 1+2 and 1+6 machines, prebaked.
#
#   bench/converge.sh                    # sizes "2 6", prebaked
#   SIZES="2" FLAVOURS="stock prebaked" bench/converge.sh
#
# Runs in a lab of its own (LAB_NAME=cbench, 10.89.70.0/24) and removes it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export LAB_NAME=cbench LAB_SUBNET_PREFIX=10.89.70 LAB_API_PORT=16470 LAB_STATE=.lab/bench LAB_DIRECTORY=0
export CONTAINERS_CONF="$PWD/lab/containers.conf" ANSIBLE_CONFIG="$PWD/ansible.cfg"
SIZES="${SIZES:-2 6}"
FLAVOURS="${FLAVOURS:-prebaked}"
make -s dev-collection
results=()
now() { date +%s%N; }
secs() { local ms=$(( ($2 - $1) / 1000000 )); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
for flavour in $FLAVOURS; do
  for n in $SIZES; do
    echo "== 1 controller + $n compute, $flavour image"
    LAB_FLAVOUR=$flavour lab/lab.sh down >/dev/null
    LAB_FLAVOUR=$flavour LAB_COMPUTE=$n lab/lab.sh up | tail -n 1
    LAB_FLAVOUR=$flavour LAB_COMPUTE=$n lab/lab.sh sim | tail -n 1
    inv="$LAB_STATE/capi.capi_machines.yml"
    t0=$(now)
    ansible-playbook -i "$inv" playbooks/site.yml >"$LAB_STATE/logs/bench-first.log" 2>&1 \
      || { tail -n 30 "$LAB_STATE/logs/bench-first.log"; exit 1; }
    t1=$(now)
    ansible-playbook -i "$inv" playbooks/site.yml >"$LAB_STATE/logs/bench-second.log" 2>&1 \
      || { tail -n 30 "$LAB_STATE/logs/bench-second.log"; exit 1; }
    t2=$(now)
    changed=$(grep -E ' : ok=' "$LAB_STATE/logs/bench-second.log" | sed -E 's/.*changed=([0-9]+).*/\1/' \
      | awk '{s += $1} END {print s + 0}')
    printf -- '- name: An empty play\n  hosts: all\n  gather_facts: false\n  tasks:\n    - name: Reach the host\n      ansible.builtin.ping:\n' \
      >"$LAB_STATE/empty.yml"
    t3=$(now)
    ansible-playbook -i "$inv" "$LAB_STATE/empty.yml" >"$LAB_STATE/logs/bench-empty.log" 2>&1 \
      || { tail -n 30 "$LAB_STATE/logs/bench-empty.log"; exit 1; }
    t4=$(now)
    first=$(secs "$t0" "$t1"); second=$(secs "$t1" "$t2"); empty=$(secs "$t3" "$t4")
    ratio=$(awk -v a="$second" -v b="$empty" 'BEGIN {printf "%.1f", a / b}')
    echo "   first converge ${first} s, second ${second} s (changed on the second run: $changed), empty play ${empty} s"
    results+=("$(printf '%-9s %8s %14s %15s %10s %10s %8s' "$flavour" "1+$n" "$first" "$second" "$changed" "$empty" "$ratio")")
  done
done
LAB_FLAVOUR=prebaked lab/lab.sh down >/dev/null
echo
echo "converge benchmark (2-core machine; anchors from the thesis: 38.74 s per node prebaked, 267.59 s stock)"
printf '%-9s %8s %14s %15s %10s %10s %8s\n' flavour machines "first (s)" "second (s)" changed "empty (s)" "2nd/empty"
printf '%s\n' "${results[@]}"
