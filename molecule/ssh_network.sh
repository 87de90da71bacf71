#!/bin/sh
# molecule's dependency step for the scenarios Ansible reaches over SSH, as it reaches the lab's machines and
# a site's: the scenario's podman network with a fixed subnet (the machines get fixed addresses, as bare
# metal keeps its own) and the SSH key the machines take (mounted as the lab image's admin user's
# authorized_keys). The podman connection costs about three times the time and CPU of SSH with pipelining
# a task (a podman exec each time, and a copy for each module).
#     molecule/ssh_network.sh NETWORK SUBNET
set -eu
network=$1 subnet=$2
# molecule runs it from the project directory
key=${MOLECULE_PROJECT_DIRECTORY:-$PWD}/.lab/molecule/ssh/id_ed25519
if [ ! -s "$key" ]; then
  mkdir -p "$(dirname "$key")"
  ssh-keygen -q -t ed25519 -N '' -C converged-hpc-molecule -f "$key"
fi
if podman network exists "$network"; then
  have=$(podman network inspect "$network" --format '{{range .Subnets}}{{.Subnet}} {{end}}')
  case " $have" in
    *" $subnet "*) exit 0 ;;
  esac
  # an older network of that name without the subnet (nothing on it between scenarios: destroy ran)
  podman network rm "$network" >/dev/null
fi
podman network create --subnet "$subnet" "$network" >/dev/null
