#!/usr/bin/env bash
# Benchmark: site.yml's first converge through the CAPI inventory on fresh lab machines;
# a second converge in full (converged_skip_unchanged=false: every task of every role);
# then, in turn, the idempotent second converge as it runs by default (the fast path:
# nothing changed, so only the check runs) and an empty play on the same hosts (one
# ping each, through the same inventory): the floor a second converge is compared
# with. Default: 1+2 and 1+6 machines, prebaked.
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
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
secs() { local ms=$(( ($2 - $1) / 1000000 )); printf '%d.%02d' $((ms / 1000)) $((ms % 1000 / 10)); }
for flavour in $FLAVOURS; do
  for n in $SIZES; do
    echo "== 1 controller + $n compute, $flavour image"
    LAB_FLAVOUR=$flavour lab/lab.sh down >/dev/null
    LAB_FLAVOUR=$flavour LAB_COMPUTE=$n lab/lab.sh up | tail -n 1
    LAB_FLAVOUR=$flavour LAB_COMPUTE=$n lab/lab.sh mgmt | tail -n 1
    inv="$LAB_STATE/capi.capi_machines.yml"
    t0=$(now)
    ansible-playbook -i "$inv" playbooks/site.yml >"$LAB_STATE/logs/bench-first.log" 2>&1 \
      || { tail -n 30 "$LAB_STATE/logs/bench-first.log"; exit 1; }
    t1=$(now)
    ansible-playbook -i "$inv" playbooks/site.yml -e converged_skip_unchanged=false >"$LAB_STATE/logs/bench-full.log" 2>&1 \
      || { tail -n 30 "$LAB_STATE/logs/bench-full.log"; exit 1; }
    t2=$(now)
    printf -- '- name: An empty play\n  hosts: all\n  gather_facts: false\n  tasks:\n    - name: Reach the host\n      ansible.builtin.ping:\n' \
      >"$LAB_STATE/empty.yml"
    # the fast second converge and the empty play are short: taken in turn, three times each, and
    # each the median of its three
    seconds=(); empties=()
    for run in 1 2 3; do
      ts=$(now)
      ansible-playbook -i "$inv" playbooks/site.yml >"$LAB_STATE/logs/bench-second.log" 2>&1 \
        || { tail -n 30 "$LAB_STATE/logs/bench-second.log"; exit 1; }
      seconds+=("$(secs "$ts" "$(now)")")
      ts=$(now)
      ansible-playbook -i "$inv" "$LAB_STATE/empty.yml" >"$LAB_STATE/logs/bench-empty.log" 2>&1 \
        || { tail -n 30 "$LAB_STATE/logs/bench-empty.log"; exit 1; }
      empties+=("$(secs "$ts" "$(now)")")
    done
    grep -q 'nothing to do' "$LAB_STATE/logs/bench-second.log" \
      || echo "   (the second converge did not take the fast path: $(grep -A2 'Report the decision' "$LAB_STATE/logs/bench-second.log" | tail -n 1))"
    changed=$(grep -E ' : ok=' "$LAB_STATE/logs/bench-second.log" | sed -E 's/.*changed=([0-9]+).*/\1/' \
      | awk '{s += $1} END {print s + 0}')
    first=$(secs "$t0" "$t1"); second=$(median "${seconds[@]}"); full=$(secs "$t1" "$t2"); empty=$(median "${empties[@]}")
    ratio=$(awk -v a="$second" -v b="$empty" 'BEGIN {printf "%.2f", a / b}')
    echo "   first converge ${first} s, second ${second} s (${seconds[*]}; changed on the second run: $changed)," \
      "second in full ${full} s, empty play ${empty} s (${empties[*]})"
    results+=("$(printf '%-9s %8s %10s %11s %8s %10s %10s %10s' "$flavour" "1+$n" "$first" "$second" "$changed" "$full" "$empty" "$ratio")")
  done
done
LAB_FLAVOUR=prebaked lab/lab.sh down >/dev/null
echo
echo "converge benchmark (2-core machine; anchors from the thesis: 38.74 s per node prebaked, 267.59 s stock)"
printf '%-9s %8s %10s %11s %8s %10s %10s %10s\n' flavour machines "first (s)" "second (s)" changed "full (s)" "empty (s)" "2nd/empty"
printf '%s\n' "${results[@]}"
