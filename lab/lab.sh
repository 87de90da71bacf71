#!/usr/bin/env bash
# The converged.hpc lab: Debian "bare-metal machines" as systemd containers (LAB_SUITE: trixie,
# Debian 13 with Slurm 24.11, or bookworm, Debian 12 with Slurm 22.05).
#
#   lab/lab.sh deps              install what is missing: podman, runc, debootstrap (apt), requirements.txt (pip)
#   lab/lab.sh image [FLAVOUR]   build the stock or prebaked machine image (cached)
#   lab/lab.sh up                boot the machines of lab.conf (reuses running ones)
#   lab/lab.sh directory         the LDAP directory (slapd, TLS, test users) and their homes
#   lab/lab.sh mgmt              the management cluster (kube-apiserver, Cluster API, CAPM3, BMO) if it is not running
#   lab/lab.sh ping              ansible ping of every machine over SSH
#   lab/lab.sh converge          the main job: site.yml through the CAPI inventory, validate.yml
#   lab/lab.sh events            the event path: ansible-rulebook runs reconcile.yml on Machine events
#                                (LAB_EVENTS_RULEBOOK=autoscale: and autoscale.yml every LAB_AUTOSCALE_INTERVAL s)
#   lab/lab.sh events-stop       stop it
#   lab/lab.sh move FROM TO [COUNT=N|HOSTS=a,b|LABEL=k=v]   move pool hosts between MachineDeployments (move.yml)
#   lab/lab.sh rebalance [-e converged_rebalance_dry_run=true]   move idle hosts where work waits (rebalance.yml)
#   lab/lab.sh status            list the lab's machines
#   lab/lab.sh down              remove every container, network and volume of the lab
#
# Settings come from lab/lab.conf, overridable from the environment.
set -euo pipefail

LAB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$LAB_DIR")"
cd "$REPO_DIR"
# A lab remembers the settings it was made with: `up` writes them to $LAB_STATE/settings, and every later
# command on that state (lab-scale, lab-move, lab-status, events, down...) takes them, so a lab made with
# LAB_NAME=alab LAB_SUBNET_PREFIX=10.89.60 is scaled and taken down by the plain commands. A setting given
# again wins, and is said when it differs from the lab's. `down` forgets them.
SETTINGS_FILE="$REPO_DIR/${LAB_STATE:-.lab}/settings"
if [[ -f "$SETTINGS_FILE" ]]; then
  while IFS= read -r line; do
    key=${line%%=*}; value=${line#*=}
    [[ "$key" =~ ^LAB_[A-Z0-9_]+$ && "$key" != LAB_STATE ]] || continue
    if [[ -z "${!key+set}" ]]; then
      export "$key=$value"
    elif [[ "${!key}" != "$value" ]]; then
      printf '[lab] %s=%s given; this lab was made with %s=%s (%s): using %s\n' "$key" "${!key}" "$key" "$value" \
        "${SETTINGS_FILE#"$REPO_DIR"/}" "${!key}" >&2
    fi
  done <"$SETTINGS_FILE"
fi
# shellcheck source=lab/lab.conf
source "$LAB_DIR/lab.conf"
# the settings lab.conf defines, as this command has them
remember_settings() {
  mkdir -p "$(dirname "$SETTINGS_FILE")"
  local key
  # lab.conf's, and those lab.sh defaults itself
  for key in $(grep -oE '^LAB_[A-Z0-9_]+' "$LAB_DIR/lab.conf" | sort -u) LAB_EVENTS_RULEBOOK LAB_AUTOSCALE_INTERVAL \
      LAB_EVENT_WINDOW; do
    [[ "$key" == LAB_STATE || -z "${!key+set}" ]] || printf '%s=%s\n' "$key" "${!key}"
  done >"$SETTINGS_FILE.tmp"
  printf 'LAB_API_PORT=%s\n' "$API_PORT" >>"$SETTINGS_FILE.tmp"
  mv "$SETTINGS_FILE.tmp" "$SETTINGS_FILE"
}
export CONTAINERS_CONF="$LAB_DIR/containers.conf"
# the real servers (make kube-assets links them there), as make exports it
export KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$REPO_DIR/.lab/kube-assets}"

# the images of each suite: localhost/converged-hpc/debian13 (trixie), .../debian12 (bookworm), .../debian14 (forky)
suite_release() { case "$1" in forky) echo 14 ;; trixie) echo 13 ;; bookworm) echo 12 ;; *) echo "" ;; esac; }
IMAGE_REPO="localhost/converged-hpc/debian$(suite_release "$LAB_SUITE")"
LABEL="converged.hpc.lab"
NETWORK="${LAB_NAME}-net"
SSH_USER="admin"
STATE="$REPO_DIR/$LAB_STATE"
API_PORT="${LAB_API_PORT:-16443}"
# Packages of the prebaked flavour: what the roles install (slurm_common,
# munge, slurm_controller, slurm_compute, mpich, sssd, nfs_*, keepalived, mariadb,
# slurmdbd, slurmrestd),
# and the lab directory's slapd (lab/directory.yml).
PREBAKED_PACKAGES="munge slurm-client slurmctld slurmd mpich libmpich-dev gcc libc6-dev
 ldap-utils keepalived nfs-common nfs-ganesha nfs-ganesha-vfs
 libnfs-utils slapd python3-ldap mariadb-server python3-pymysql slurmdbd slurmrestd slurm-wlm-jwt-plugin"
# by suite: PMIx (renamed by Debian 13's 64-bit time_t transition), sackd (Slurm 23.11 and later), SSSD (forky has
# none: checked in its Packages index on 2026-12-02)
case "$LAB_SUITE" in
  forky) PREBAKED_PACKAGES="$PREBAKED_PACKAGES libpmix2t64 sackd" ;;
  trixie) PREBAKED_PACKAGES="$PREBAKED_PACKAGES libpmix2t64 sackd sssd-ldap libnss-sss libpam-sss" ;;
  *) PREBAKED_PACKAGES="$PREBAKED_PACKAGES libpmix2 sssd-ldap libnss-sss libpam-sss" ;;
esac
BASE_PACKAGES="systemd,systemd-sysv,dbus,python3,python3-apt,iproute2,openssh-server,sudo,procps,ca-certificates,less"
# cloud-init, as on a cloud or Metal3 image: it applies a Machine's bootstrap data at first boot
# (lab/machines.py hands it over as a NoCloud seed); a machine without one boots without it.
# (Installed with apt after debootstrap, which cannot resolve its virtual dependencies.)
IMAGE_PACKAGES="cloud-init"
# bump when the images' make-up changes: lab/lab.sh image rebuilds an image of another version
IMAGE_VERSION=3

T0=$(date +%s%N)
# elapsed seconds since T0 (or since $1, a date +%s%N stamp), one decimal
elapsed() { local ms=$(( ($(date +%s%N) - ${1:-$T0}) / 1000000 )); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
say() { printf '[lab %6ss] %s\n' "$(elapsed)" "$*"; }
die() { printf '[lab] ERROR: %s\n' "$*" >&2; exit 1; }
# die_with_log WHAT LOG: print the log's errors (else its last lines), then what failed
# and where the whole log is. Never fails itself, whatever the log contains.
die_with_log() {
  local what="$1" log="$2" excerpt=""
  if [[ -s "$log" ]]; then
    excerpt=$(grep -A12 -E '^(fatal|\[ERROR\]|ERROR)' "$log" 2>/dev/null | head -n 30) || true
    [[ -n "$excerpt" ]] || excerpt=$(tail -n 25 "$log") || true
    printf '%s\n' "$excerpt" >&2
  fi
  die "$what failed (log: ${log#"$REPO_DIR"/})"
}

# Run a long command, printing a heartbeat every 15 s so nobody stares at silence.
with_heartbeat() {
  local what="$1"; shift
  local log="$STATE/logs/${what// /_}.log"
  mkdir -p "$STATE/logs"
  "$@" >"$log" 2>&1 &
  local pid=$! start; start=$(date +%s)
  while kill -0 "$pid" 2>/dev/null; do
    sleep 3
    if (( ($(date +%s) - start) % 15 < 3 )) && kill -0 "$pid" 2>/dev/null; then
      say "  ... $what still running ($(( $(date +%s) - start )) s, log: ${log#"$REPO_DIR"/})"
    fi
  done
  wait "$pid" || die_with_log "$what" "$log"
}

validate_conf() {
  [[ -n "$(suite_release "$LAB_SUITE")" ]] || die "LAB_SUITE='$LAB_SUITE' is not trixie, bookworm or forky"
  [[ "$LAB_SUITE" != forky || "$LAB_DIRECTORY" == 0 ]] \
    || die "LAB_SUITE=forky has no SSSD packages (sssd-ldap, libnss-sss, libpam-sss): set LAB_DIRECTORY=0"
  [[ "$LAB_FLAVOUR" == stock || "$LAB_FLAVOUR" == prebaked ]] \
    || die "LAB_FLAVOUR='$LAB_FLAVOUR' is not stock or prebaked"
  [[ "$LAB_LEAST_PRIVILEGE" == 0 || "$LAB_LEAST_PRIVILEGE" == 1 ]] \
    || die "LAB_LEAST_PRIVILEGE='$LAB_LEAST_PRIVILEGE' must be 0 or 1"
  [[ "$LAB_KEDA" == 0 || "$LAB_KEDA" == 1 ]] || die "LAB_KEDA='$LAB_KEDA' must be 0 or 1"
  [[ "$LAB_CONTROLLERS" =~ ^[0-9]+$ && "$LAB_CONTROLLERS" -le 9 ]] \
    || die "LAB_CONTROLLERS='$LAB_CONTROLLERS' must be an integer 0-9"
  [[ "$LAB_COMPUTE" =~ ^[0-9]+$ && "$LAB_COMPUTE" -le 179 ]] \
    || die "LAB_COMPUTE='$LAB_COMPUTE' must be an integer 0-179"
  [[ "$LAB_LOGIN" =~ ^[0-3]$ ]] || die "LAB_LOGIN='$LAB_LOGIN' must be an integer 0-3"
  [[ "$LAB_GPU" =~ ^[0-9]+$ && "$LAB_GPU" -le 29 ]] || die "LAB_GPU='$LAB_GPU' must be an integer 0-29"
  [[ "$LAB_BARE_METAL" =~ ^[0-9]+$ && "$LAB_BARE_METAL" -le 40 ]] \
    || die "LAB_BARE_METAL='$LAB_BARE_METAL' must be an integer 0-40"
  [[ "$LAB_BARE_METAL_GPU" =~ ^[0-9]+$ && "$LAB_BARE_METAL_GPU" -le "$LAB_BARE_METAL" ]] \
    || die "LAB_BARE_METAL_GPU='$LAB_BARE_METAL_GPU' must be an integer 0-LAB_BARE_METAL ($LAB_BARE_METAL)"
  [[ "$LAB_KUBERNETES_GPU" =~ ^[0-9]+$ ]] || die "LAB_KUBERNETES_GPU='$LAB_KUBERNETES_GPU' must be an integer"
  (( LAB_KUBERNETES_GPU == 0 || LAB_BARE_METAL > 0 )) \
    || die "LAB_KUBERNETES_GPU=$LAB_KUBERNETES_GPU Kubernetes workers take their hosts from the pool: set LAB_BARE_METAL"
  [[ "$LAB_DEPROVISION_SECONDS" =~ ^[0-9]+(\.[0-9]+)?$ ]] \
    || die "LAB_DEPROVISION_SECONDS='$LAB_DEPROVISION_SECONDS' must be a number of seconds"
  [[ "$LAB_PROVISION_SECONDS" =~ ^[0-9]+(\.[0-9]+)?$ ]] \
    || die "LAB_PROVISION_SECONDS='$LAB_PROVISION_SECONDS' must be a number of seconds"
  [[ -z "$LAB_COMPUTE_HOSTS" || ( "$LAB_COMPUTE_HOSTS" =~ ^[0-9]+$ && "$LAB_COMPUTE_HOSTS" -ge "$LAB_COMPUTE" \
     && "$LAB_COMPUTE_HOSTS" -le 179 ) ]] \
    || die "LAB_COMPUTE_HOSTS='$LAB_COMPUTE_HOSTS' must be an integer from LAB_COMPUTE ($LAB_COMPUTE) to 179"
  [[ "$LAB_CGROUPS" =~ ^[01]$ ]] || die "LAB_CGROUPS='$LAB_CGROUPS' must be 0 or 1"
  [[ "$LAB_COMPUTE_JOIN_AT_BOOT" =~ ^[01]$ ]] || die "LAB_COMPUTE_JOIN_AT_BOOT='$LAB_COMPUTE_JOIN_AT_BOOT' must be 0 or 1"
  [[ "$LAB_SPARE_HOSTS" =~ ^[0-9]$ ]] || die "LAB_SPARE_HOSTS='$LAB_SPARE_HOSTS' must be an integer 0-9"
  (( LAB_BARE_METAL == 0 || LAB_CLUSTERS == 1 )) \
    || die "LAB_BARE_METAL=$LAB_BARE_METAL: the bare-metal pool serves one cluster (LAB_CLUSTERS=$LAB_CLUSTERS)"
  if (( LAB_BARE_METAL > 0 )); then
    (( LAB_COMPUTE <= LAB_BARE_METAL - LAB_BARE_METAL_GPU )) || die "LAB_COMPUTE=$LAB_COMPUTE compute machines" \
      "need as many hosts without a GPU in the pool: LAB_BARE_METAL=$LAB_BARE_METAL has $((LAB_BARE_METAL - LAB_BARE_METAL_GPU))"
    (( LAB_GPU + LAB_KUBERNETES_GPU <= LAB_BARE_METAL_GPU )) || die "LAB_GPU=$LAB_GPU GPU machines and" \
      "LAB_KUBERNETES_GPU=$LAB_KUBERNETES_GPU Kubernetes GPU workers need as many GPU hosts in the pool:" \
      "LAB_BARE_METAL_GPU=$LAB_BARE_METAL_GPU"
  fi
  [[ "$LAB_HIGHMEM" =~ ^[0-9]+$ && "$LAB_HIGHMEM" -le 22 ]] || die "LAB_HIGHMEM='$LAB_HIGHMEM' must be an integer 0-22"
  [[ "$LAB_SUBNET_PREFIX" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] \
    || die "LAB_SUBNET_PREFIX='$LAB_SUBNET_PREFIX' must look like 10.89.50"
  [[ "$LAB_NAME" =~ ^[a-z][a-z0-9-]{0,20}$ ]] \
    || die "LAB_NAME='$LAB_NAME' must be lowercase letters, digits and dashes"
  [[ "$LAB_MUNGE_KEY_SOURCE" == secret || "$LAB_MUNGE_KEY_SOURCE" == generate ]] \
    || die "LAB_MUNGE_KEY_SOURCE='$LAB_MUNGE_KEY_SOURCE' is not secret or generate"
  [[ "$LAB_DIRECTORY" == 0 || "$LAB_DIRECTORY" == 1 ]] \
    || die "LAB_DIRECTORY='$LAB_DIRECTORY' is not 0 or 1"
  [[ "$LAB_HA" == 0 || ( "$LAB_HA" == 1 && "$LAB_CONTROLLERS" -ge 2 && "$LAB_CLUSTERS" == 1 ) ]] \
    || die "LAB_HA='$LAB_HA' must be 0, or 1 with LAB_CONTROLLERS >= 2 (it is $LAB_CONTROLLERS) and LAB_CLUSTERS=1"
  [[ "$LAB_ACCOUNTING_HOST" == 0 || ( "$LAB_ACCOUNTING_HOST" == 1 && "$LAB_CLUSTERS" == 1 ) ]] \
    || die "LAB_ACCOUNTING_HOST='$LAB_ACCOUNTING_HOST' must be 0, or 1 with LAB_CLUSTERS=1"
  [[ "$LAB_CLUSTERS" =~ ^[1-9]$ && "$LAB_CLUSTERS" -le "$(( LAB_CONTROLLERS > 0 ? LAB_CONTROLLERS : 1 ))" ]] \
    || die "LAB_CLUSTERS='$LAB_CLUSTERS' must be 1-9 and at most LAB_CONTROLLERS ($LAB_CONTROLLERS): one controller each"
}

cmd_deps() {
  local missing=()
  mkdir -p "$STATE/logs"
  # java: ansible-rulebook (the event path) runs its rules engine on a Java 17 runtime (or newer)
  for tool in podman runc debootstrap iptables ssh-keygen ssh flock ps git openssl; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])' || missing+=("java 17")
  if ((${#missing[@]})); then
    say "installing Debian packages for: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq podman runc debootstrap uidmap slirp4netns netavark aardvark-dns iptables \
      openssh-client util-linux procps git openssl openjdk-17-jre-headless >/dev/null
  fi
  # The Python side (ansible-playbook, the kubernetes client the inventory plugin and
  # the lab's tools use, ansible-rulebook for the event path): requirements.txt,
  # installed when any of it is missing.
  if ! command -v ansible-playbook >/dev/null || ! command -v ansible-rulebook >/dev/null \
      || ! python3 -c 'import ansible, kubernetes, yaml, netaddr, jinja2' 2>/dev/null; then
    say "installing Python packages: pip install -r requirements.txt"
    python3 -m pip install -q -r "$REPO_DIR/requirements.txt" >"$STATE/logs/pip.log" 2>&1 \
      || die_with_log "pip install -r requirements.txt" "$STATE/logs/pip.log"
    hash -r
  fi
}

image_name() { echo "$IMAGE_REPO:$1"; }
# the image's converged.hpc.image-version label: empty when it has none or does not exist
image_version() {
  podman image inspect -f '{{ index .Labels "converged.hpc.image-version" }}' "$(image_name "$1")" 2>/dev/null \
    | sed 's/<no value>//' || true
}

# The Debian archive and security archive this machine's apt uses (sources.list, sources.list.d/*.list
# and deb822 *.sources; a Debian suite's first enabled entry of each), unless LAB_DEBIAN_MIRROR and
# LAB_DEBIAN_SECURITY_MIRROR say: "ARCHIVE SECURITY" on one line. The repository names no mirror.
debian_mirrors() {
  if [[ -n "$LAB_DEBIAN_MIRROR" ]]; then
    echo "$LAB_DEBIAN_MIRROR ${LAB_DEBIAN_SECURITY_MIRROR:-}"
    return
  fi
  python3 - <<'EOF'
import glob, re
SUITES = r"(buster|bullseye|bookworm|trixie|forky|duke|sid|oldoldstable|oldstable|stable|testing|unstable)"
entries = []  # (uri, suite)
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb":
            entries.append((words[1], words[2]))
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(path).read()):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace() and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            entries += [(uri, suite) for uri in fields.get("uris", "").split()
                        for suite in fields.get("suites", "").split()]
archive = next((u for u, s in entries if re.fullmatch(SUITES + r"(-updates|-backports)?", s)), "")
security = next((u for u, s in entries if re.fullmatch(SUITES + r"(-security|/updates)", s)), "")
print(archive.rstrip("/"), security.rstrip("/"))
EOF
}

build_stock() {
  local img root mirror security
  img=$(image_name stock)
  root="$STATE/rootfs-$LAB_SUITE"  # one per release: make test builds Debian 12 while the labs run
  rm -rf "$root"; mkdir -p "$root"
  read -r mirror security < <(debian_mirrors)
  [[ -n "$mirror" ]] || die "no Debian archive in this machine's apt sources (/etc/apt/sources.list*): set LAB_DEBIAN_MIRROR (and LAB_DEBIAN_SECURITY_MIRROR) to the mirror to build the images from"
  say "debootstrap Debian $(suite_release "$LAB_SUITE") ($LAB_SUITE) from $mirror into $LAB_STATE/rootfs-$LAB_SUITE (about a minute)"
  # a suite newer than this machine's debootstrap (forky on Debian 12) is made as sid is, by sid's script
  local script=()
  [[ -e "/usr/share/debootstrap/scripts/$LAB_SUITE" ]] || script=(/usr/share/debootstrap/scripts/sid)
  with_heartbeat "debootstrap" debootstrap --variant=minbase --include="$BASE_PACKAGES" \
    "$LAB_SUITE" "$root" "$mirror" "${script[@]}"
  say "configuring the machine image (admin user, sudo, first-boot SSH host keys)"
  rm -f "$root/etc/apt/sources.list.d/debian.sources"
  {
    echo "deb $mirror $LAB_SUITE main"
    echo "deb $mirror $LAB_SUITE-updates main"
    if [[ -n "$security" ]]; then echo "deb $security $LAB_SUITE-security main"; fi
  } >"$root/etc/apt/sources.list"
  if [[ "$LAB_SUITE" == forky ]]; then
    # testing's Release files say they expire a week after they are made, and the archive this machine reaches
    # may serve an older one (seen 2026-12-02: forky's "expired 26 days ago"): its machines take it as it is
    printf '%s\n' "// lab/lab.sh: forky (testing) as the archive served it when the image was built" \
      'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99converged-hpc-lab-testing"
  fi
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"; chmod 0755 "$root/usr/sbin/policy-rc.d"
  # shellcheck disable=SC2086
  with_heartbeat "apt-get install $IMAGE_PACKAGES" chroot "$root" bash -c "apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $IMAGE_PACKAGES"
  rm -f "$root/usr/sbin/policy-rc.d"
  chroot "$root" useradd --create-home --shell /bin/bash --uid 1500 "$SSH_USER"
  install -d -m 0700 -o 1500 -g 1500 "$root/home/$SSH_USER/.ssh"
  echo "$SSH_USER ALL=(ALL) NOPASSWD:ALL" >"$root/etc/sudoers.d/90-lab-admin"
  chmod 0440 "$root/etc/sudoers.d/90-lab-admin"
  # Every machine must get host keys of its own, made at its first boot.
  rm -f "$root"/etc/ssh/ssh_host_*
  install -m 0644 "$LAB_DIR/images/lab-ssh-hostkeys.service" "$root/etc/systemd/system/"
  ln -sf /etc/systemd/system/lab-ssh-hostkeys.service \
    "$root/etc/systemd/system/multi-user.target.wants/lab-ssh-hostkeys.service"
  # cloud-init only from a seed (NoCloud, as lab/machines.py writes it, or a config drive, as
  # Metal3 attaches it): with none, ds-identify finds nothing and cloud-init stays off for that
  # boot (one datasource alone would be taken unchecked). The lab's network, hostname, users,
  # host keys and locale are left as they are.
  cat >"$root/etc/cloud/cloud.cfg.d/90-converged-lab.cfg" <<'EOF'
datasource_list: [NoCloud, ConfigDrive]
locale: false
network: {config: disabled}
preserve_hostname: true
manage_etc_hosts: false
users: []
disable_root: false
ssh_deletekeys: false
ssh_genkeytypes: []
apt: {preserve_sources_list: true}
EOF
  # No consoles in a container; keep the journal small.
  ln -sf /dev/null "$root/etc/systemd/system/getty.target"
  ln -sf /dev/null "$root/etc/systemd/system/console-getty.service"
  mkdir -p "$root/etc/systemd/journald.conf.d"
  printf '[Journal]\nSystemMaxUse=32M\n' >"$root/etc/systemd/journald.conf.d/lab.conf"
  : >"$root/etc/machine-id"
  rm -f "$root/etc/hostname"
  chroot "$root" apt-get clean
  # No package lists inside, and an old cache date, like a fresh install image:
  # the roles' "refresh the apt cache when older than ..." must really refresh.
  rm -rf "$root"/var/lib/apt/lists/*
  touch -d @0 "$root"/var/lib/apt/lists "$root"/var/cache/apt
  say "importing the root filesystem as $img"
  with_heartbeat "podman import" bash -c "tar -C '$root' -c . | podman import \
    --change 'CMD [\"/sbin/init\"]' --change 'STOPSIGNAL SIGRTMIN+3' \
    --change 'LABEL converged.hpc.image-version=$IMAGE_VERSION' - '$img'"
  rm -rf "$root"
}

build_prebaked() {
  local img; img=$(image_name prebaked)
  say "building $img: stock + the roles' packages (about a minute)"
  # shellcheck disable=SC2086
  with_heartbeat "podman build prebaked" podman build --build-arg "BASE=$(image_name stock)" \
    --build-arg "PACKAGES=$(echo $PREBAKED_PACKAGES)" -t "$img" \
    -f "$LAB_DIR/images/Containerfile.prebaked" "$LAB_DIR/images"
}

cmd_image() {
  local flavour="${1:-$LAB_FLAVOUR}" force="${FORCE:-0}"
  [[ "$flavour" == stock || "$flavour" == prebaked ]] || die "image flavour '$flavour' is not stock or prebaked"
  if [[ "$force" != 1 ]] && [[ "$(image_version "$flavour")" == "$IMAGE_VERSION" ]]; then
    say "image $(image_name "$flavour") exists (FORCE=1 rebuilds it)"
    return
  fi
  if [[ "$force" != 1 ]] && podman image exists "$(image_name "$flavour")"; then
    say "image $(image_name "$flavour") is of version '$(image_version "$flavour")', the lab's is $IMAGE_VERSION: rebuilding it"
  fi
  if [[ "$flavour" == prebaked ]] && [[ "$(image_version stock)" != "$IMAGE_VERSION" ]]; then
    build_stock
  fi
  "build_$flavour"
  say "image $(image_name "$flavour") ready"
}

# The Cluster API clusters the lab's machines are split into (LAB_CLUSTERS): the lab's
# name alone, or <name>-1, <name>-2... (lab/capi_objects.py deals machines out in turn).
lab_clusters() {
  local i
  if (( LAB_CLUSTERS == 1 )); then echo "$LAB_NAME"; return; fi
  for ((i = 1; i <= LAB_CLUSTERS; i++)); do echo "$LAB_NAME-$i"; done
}

# The lab's directory machine (not a Cluster API Machine: sites bring their own directory).
directory_machine() {
  [[ "$LAB_DIRECTORY" == 1 ]] && printf '%s-dir %s.5 directory\n' "$LAB_NAME" "$LAB_SUBNET_PREFIX"
  return 0
}

# name ip node-type of the bare-metal pool's hosts the real controllers claimed (booted by the host agent)
pool_machines() {
  (( LAB_BARE_METAL > 0 )) || return 0
  python3 "$LAB_DIR/mgmt.py" claimed "$STATE/capi/kubeconfig" --prefix "$LAB_NAME-bm-"
}

# name ip node-type, one line per wanted machine
wanted_machines() {
  local i
  for ((i = 1; i <= LAB_CONTROLLERS; i++)); do
    printf '%s-ctl-%02d %s.%d controller\n' "$LAB_NAME" "$i" "$LAB_SUBNET_PREFIX" $((10 + i))
  done
  # with a bare-metal pool, the compute and GPU machines are the pool's hosts, booted when claimed
  (( LAB_BARE_METAL > 0 )) || for ((i = 1; i <= LAB_COMPUTE; i++)); do
    printf '%s-cn-%02d %s.%d compute\n' "$LAB_NAME" "$i" "$LAB_SUBNET_PREFIX" $((20 + i))
  done
  if [[ "$LAB_ACCOUNTING_HOST" == 1 ]]; then
    printf '%s-db-01 %s.6 accounting\n' "$LAB_NAME" "$LAB_SUBNET_PREFIX"
  fi
  for ((i = 1; i <= LAB_LOGIN; i++)); do
    printf '%s-login-%02d %s.%d login\n' "$LAB_NAME" "$i" "$LAB_SUBNET_PREFIX" $((6 + i))
  done
  (( LAB_BARE_METAL > 0 )) || for ((i = 1; i <= LAB_GPU; i++)); do
    printf '%s-gpu-%02d %s.%d gpu\n' "$LAB_NAME" "$i" "$LAB_SUBNET_PREFIX" $((200 + i))
  done
  for ((i = 1; i <= LAB_HIGHMEM; i++)); do
    printf '%s-hm-%02d %s.%d highmem\n' "$LAB_NAME" "$i" "$LAB_SUBNET_PREFIX" $((230 + i))
  done
}

# The real management cluster's hosts: the lab's machines, and spare hosts (name ip type spare) the
# MachineDeployments scale onto: the compute pool's up to LAB_COMPUTE_HOSTS (default 4, or LAB_COMPUTE when
# more), and LAB_SPARE_HOSTS more of each of the GPU and highmem node types the lab has
compute_hosts() { local n="${LAB_COMPUTE_HOSTS:-4}"; (( n >= LAB_COMPUTE )) || n=$LAB_COMPUTE; echo "$n"; }
real_hosts() {
  local i
  wanted_machines
  # (with a bare-metal pool the compute and GPU machines are the pool's hosts: capi_objects.py --bare-metal)
  (( LAB_BARE_METAL > 0 )) || for ((i = LAB_COMPUTE + 1; i <= $(compute_hosts); i++)); do
    printf '%s-cn-%02d %s.%d compute spare\n' "$LAB_NAME" "$i" "$LAB_SUBNET_PREFIX" $((20 + i))
  done
  (( LAB_GPU == 0 || LAB_BARE_METAL > 0 )) || for ((i = LAB_GPU + 1; i <= LAB_GPU + LAB_SPARE_HOSTS && i <= 29; i++)); do
    printf '%s-gpu-%02d %s.%d gpu spare\n' "$LAB_NAME" "$i" "$LAB_SUBNET_PREFIX" $((200 + i))
  done
  (( LAB_HIGHMEM == 0 )) || for ((i = LAB_HIGHMEM + 1; i <= LAB_HIGHMEM + LAB_SPARE_HOSTS && i <= 22; i++)); do
    printf '%s-hm-%02d %s.%d highmem spare\n' "$LAB_NAME" "$i" "$LAB_SUBNET_PREFIX" $((230 + i))
  done
}

ensure_key() {
  if [[ ! -f "$STATE/ssh/id_ed25519" ]]; then
    mkdir -p "$STATE/ssh"; chmod 0700 "$STATE/ssh"
    ssh-keygen -q -t ed25519 -N '' -C "converged-hpc-lab" -f "$STATE/ssh/id_ed25519"
    say "generated the lab SSH key $LAB_STATE/ssh/id_ed25519"
  fi
  chmod 0644 "$STATE/ssh/id_ed25519.pub"
}

# A lab killed uncleanly (its containers gone, its network removed or never written) can leave the
# kernel bridge podman made for it, still holding the gateway address: podman then refuses the subnet
# ("subnet ... is already used on the host"). Such a bridge - named podman*, no port on it, a subnet no
# podman network claims - belongs to nobody and is removed; anything else holding the address is named.
clear_stale_bridge() {
  local dev claimed net
  dev=$(ip -o -4 addr show 2>/dev/null | awk -v a="$LAB_SUBNET_PREFIX.1/24" '$4 == a && !found {print $2; found = 1}' || true)
  [[ -n "$dev" ]] || return 0
  for net in $(podman network ls -q); do
    claimed=$(podman network inspect -f '{{range .Subnets}}{{.Subnet}} {{end}}' "$net" 2>/dev/null)
    [[ " $claimed " == *" $LAB_SUBNET_PREFIX.0/24 "* ]] \
      && die "subnet $LAB_SUBNET_PREFIX.0/24 is podman network $net's: set LAB_SUBNET_PREFIX to another"
  done
  if [[ "$dev" == podman* && -z "$(ip -o link show master "$dev" 2>/dev/null)" ]]; then
    ip link delete "$dev" && say "removed $dev, a bridge a lab killed earlier left holding $LAB_SUBNET_PREFIX.1"
  else
    die "$LAB_SUBNET_PREFIX.1 is held by interface $dev, not a lab's: set LAB_SUBNET_PREFIX to another subnet"
  fi
}

ensure_network() {
  if ! podman network exists "$NETWORK"; then
    clear_stale_bridge
    podman network create --label "$LABEL=$LAB_NAME" --subnet "$LAB_SUBNET_PREFIX.0/24" \
      --gateway "$LAB_SUBNET_PREFIX.1" "$NETWORK" >/dev/null
    say "created network $NETWORK ($LAB_SUBNET_PREFIX.0/24)"
  fi
  if ! podman volume exists "${LAB_NAME}-shared"; then
    podman volume create --label "$LABEL=$LAB_NAME" "${LAB_NAME}-shared" >/dev/null
  fi
}

# Machines are booted, checked and removed by lab/machines.py (also the host agent's
# provisioner): start NAME IP TYPE, ready NAME IP.
machines() { LAB_NAME="$LAB_NAME" LAB_SUITE="$LAB_SUITE" LAB_FLAVOUR="$LAB_FLAVOUR" LAB_SUBNET_PREFIX="$LAB_SUBNET_PREFIX" \
  LAB_STATE="$LAB_STATE" LAB_CPUS="$LAB_CPUS" LAB_RAM_MIB="$LAB_RAM_MIB" python3 "$LAB_DIR/machines.py" "$@"; }

write_state() {
  local machines="$STATE/machines.tsv"
  wanted_machines >"$machines"
  # A static inventory of the lab (the CAPI inventory replaces it once the management cluster runs).
  {
    echo "# Written by lab/lab.sh: the lab's machines over SSH. Do not edit."
    echo "all:"
    echo "  vars:"
    echo "    ansible_user: $SSH_USER"
    echo "    ansible_become: true"
    echo "    ansible_ssh_private_key_file: $STATE/ssh/id_ed25519"
    echo "    ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    echo "    converged_lab_cpus: $LAB_CPUS"
    echo "    converged_lab_ram_mib: $LAB_RAM_MIB"
    echo "  children:"
    for type in controller compute accounting login gpu highmem; do
      echo "    $type:"
      if grep -q " $type\$" "$machines"; then
        echo "      hosts:"
        awk -v t="$type" '$3 == t { printf "        %s:\n          ansible_host: %s\n", $1, $2 }' "$machines"
      else
        echo "      hosts: {}"
      fi
    done
    directory_machine | awk '{ printf "    directory:\n      hosts:\n        %s:\n          ansible_host: %s\n", $1, $2 }'
  } >"$STATE/hosts.yml"
}

# The lab's LDAP directory: secrets made here (0600, never printed), slapd set up by
# lab/directory.yml, which also creates the test users' homes on the NFS server.
cmd_directory() {
  [[ "$LAB_DIRECTORY" == 1 ]] || { say "LAB_DIRECTORY=0: no directory machine"; return 0; }
  [[ -f "$STATE/hosts.yml" ]] || die "no lab machines: run 'make lab' first"
  local dir="$STATE/directory" t0; t0=$(date +%s%N)
  mkdir -p "$dir" "$STATE/logs"; chmod 0700 "$dir"
  for pw in admin bind; do
    [[ -f "$dir/$pw.pw" ]] || (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$dir/$pw.pw")
  done
  ansible-playbook -i "$STATE/hosts.yml" "$LAB_DIR/directory.yml" -e "lab_directory_state=$dir" \
    >"$STATE/logs/directory.log" 2>&1 \
    || die_with_log "lab/directory.yml" "$STATE/logs/directory.log"
  say "directory ${LAB_NAME}-dir: slapd with ldaps://, users alice and bob (group hpcusers) in $(elapsed "$t0") s"
}

# Every systemd machine takes several inotify instances; the kernel default (128 per
# user, and all lab machines run as root) stops new machines from booting at about
# a dozen. Raise the host's limits once (a lab host setting, not a production one).
raise_host_limits() {
  local key want
  for key in fs.inotify.max_user_instances=2048 fs.inotify.max_user_watches=524288; do
    want=${key#*=}
    if (( $(sysctl -n "${key%%=*}") < want )); then
      sysctl -q -w "$key" && say "raised ${key%%=*} to $want for the lab's systemd machines"
    fi
  done
}


cmd_up() {
  validate_conf
  remember_settings
  cmd_deps
  raise_host_limits
  cmd_image "$LAB_FLAVOUR"
  ensure_key
  ensure_network
  local t_boot; t_boot=$(date +%s%N)
  # Machines beyond the configured size are removed, so lab.conf stays the truth.
  local keep; keep=$( { wanted_machines; directory_machine; } | awk '{print $1}')
  for name in $(podman ps -a --filter "label=$LABEL=$LAB_NAME" --format '{{.Names}}'); do
    if ! grep -qx "$name" <<<"$keep"; then
      podman rm -f "$name" >/dev/null; say "$name removed (not in the lab's size any more)"
    fi
  done
  # The Cluster API machines are booted by the host agent, once the controllers have claimed and
  # provisioned their hosts (mgmt_start); the directory is not one.
  while read -r name ip type; do machines start "$name" "$ip" "$type" </dev/null || die "booting $name failed"
  done < <(directory_machine)
  write_state
  mgmt_start
  say "waiting until every machine has booted and answers SSH"
  local ready=0 expected
  expected=$( { wanted_machines; directory_machine; pool_machines; } | wc -l)
  while read -r name ip _; do machines ready "$name" "$ip" </dev/null || exit 1; ready=$((ready + 1))
  done < <(wanted_machines; directory_machine; pool_machines)
  (( ready == expected )) || die "only $ready machine(s) were checked"
  write_state
  say "$expected machines up and reachable over SSH in $(elapsed "$t_boot") s (inventory: $LAB_STATE/hosts.yml)"
}

# The lab's management cluster (mgmt_start: started by 'up', again here when it is not running), the
# lab's kubeconfig for it, and the CAPI inventory source.
cmd_mgmt() {
  validate_conf
  [[ -f "$STATE/machines.tsv" ]] || die "no lab machines: run 'make lab' first"
  # The cluster's munge key and the accounting database's password live in the management cluster.
  lab_secrets
  mgmt_running || mgmt_start
  write_lab_files
}

# The lab's kubeconfig for its management cluster (the admin token): write_kubeconfig URL [CA_FILE]
write_kubeconfig() {
  local dir="$STATE/capi"
  (umask 077; cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
current-context: $LAB_NAME-mgmt
clusters:
  - name: $LAB_NAME-mgmt
    cluster:
      server: $1
${2:+      certificate-authority: $2}
users:
  - name: $LAB_NAME-admin
    user:
      token: $(cat "$dir/token")
contexts:
  - name: $LAB_NAME-mgmt
    context:
      cluster: $LAB_NAME-mgmt
      user: $LAB_NAME-admin
EOF
)
}

# The kubeconfig the collection's parts reach the management cluster with: the collection's own identity
# (LAB_LEAST_PRIVILEGE=1: the roles of rbac/), else the lab's admin one.
collection_kubeconfig() {
  if [[ "$LAB_LEAST_PRIVILEGE" == 1 ]]; then echo "$STATE/capi/collection.kubeconfig"; else echo "$STATE/capi/kubeconfig"; fi
}

# What the playbooks read of the running lab: the CAPI inventory source and the lab's group_vars.
write_lab_files() {
  local dir="$STATE/capi" kubeconfig
  kubeconfig="$(collection_kubeconfig)"
  if [[ "$LAB_LEAST_PRIVILEGE" == 1 ]]; then
    python3 "$LAB_DIR/mgmt.py" identity "$dir/kubeconfig" "$kubeconfig" \
      || die "making the collection's own identity (lab/mgmt.py identity, the roles of rbac/) failed"
  fi
  cat >"$STATE/capi.capi_machines.yml" <<EOF
# Written by lab/lab.sh: the lab's machines as Cluster API reports them.
plugin: converged.hpc.capi_machines
kubeconfig: $kubeconfig
namespaces: [metal3]
clusters: [$(lab_clusters | paste -sd, - | sed 's/,/, /g')]
EOF
  # Cluster API names a MachineDeployment's Machines <deployment>-<hash>-<random>: the hosts are named as
  # their hardware (and Slurm) knows them
  echo "host_naming: hostname" >>"$STATE/capi.capi_machines.yml"
  # The roles' lab settings are a checked-in file (lab/group_vars.yml); only the
  # facts of this running lab are written here.
  [[ -f "$LAB_DIR/group_vars.yml" ]] || die "the lab's role settings $LAB_DIR/group_vars.yml are missing"
  rm -rf "$STATE/group_vars"; mkdir -p "$STATE/group_vars/all"
  ln -s "$LAB_DIR/group_vars.yml" "$STATE/group_vars/all/settings.yml"
  local directory=false
  [[ "$LAB_DIRECTORY" == 1 && -f "$STATE/directory/ca.crt" ]] && directory=true
  printf '%s\n' "# Written by lab/lab.sh: the running lab's facts (lab/group_vars.yml uses them)." \
    "lab_name: $LAB_NAME" "lab_state: $STATE" "lab_subnet: $LAB_SUBNET_PREFIX.0/24" \
    "lab_munge_key_source: $LAB_MUNGE_KEY_SOURCE" "lab_directory: $directory" \
    "lab_kubeconfig: $kubeconfig" >"$STATE/group_vars/all/lab.yml"
  if [[ "$LAB_SUITE" == forky || "$LAB_CGROUPS" == 0 ]]; then
    printf '%s\n' "# Written by lab/lab.sh (LAB_SUITE=forky or LAB_CGROUPS=0): Slurm 26.05 refuses this host's cgroups (v1, hybrid: \"Hybrid" \
      "# mode is not supported\"), so the forky lab's Slurm tracks processes without them (the roles' default stays cgroup)." \
      "slurm_controller_proctrack_type: proctrack/linuxproc" "slurm_controller_task_plugin: task/affinity" \
      "slurm_controller_jobacct_gather_type: jobacct_gather/linux" \
      "slurm_controller_cgroup_config: {CgroupPlugin: disabled}" >"$STATE/group_vars/all/forky.yml"
  fi
  local join_at_boot=()
  if (( LAB_BARE_METAL_GPU > 0 )); then
    # the pool's GPU hosts, by the names they register with: their gres.conf lines ahead (lab/group_vars.yml)
    printf 'lab_gpu_pool_hosts: "%s-bm-[01-%02d]"\n' "$LAB_NAME" "$LAB_BARE_METAL_GPU" >>"$STATE/group_vars/all/lab.yml"
    # the Slurm gpu MachineDeployment joins at boot (lab/lab.sh converge names the Secret in its template)
    [[ "$LAB_JOIN_AT_BOOT" == 1 ]] && join_at_boot+=("$LAB_NAME-gpu")
  fi
  [[ "$LAB_COMPUTE_JOIN_AT_BOOT" == 1 ]] && join_at_boot+=("$LAB_NAME-compute")
  if (( ${#join_at_boot[@]} > 0 )); then
    printf '%s\n' "# Written by lab/lab.sh (LAB_JOIN_AT_BOOT, LAB_COMPUTE_JOIN_AT_BOOT): these Machines join at boot." \
      "converged_join_at_boot: [$(IFS=,; echo "${join_at_boot[*]}")]" >"$STATE/group_vars/all/join-at-boot.yml"
  fi
  if (( LAB_KUBERNETES_GPU > 0 )); then
    local workload_kubeconfig="$dir/workload/kubeconfig"
    if [[ "$LAB_LEAST_PRIVILEGE" == 1 ]]; then
      # rebalance.yml's reads of the workload cluster: its own identity there, with rbac/workload_reader.yml only
      workload_kubeconfig="$dir/workload/collection.kubeconfig"
      python3 "$LAB_DIR/mgmt.py" identity "$dir/workload/kubeconfig" "$workload_kubeconfig" --role workload_reader \
        || die "making the collection's identity in the workload cluster (lab/mgmt.py identity --role workload_reader) failed"
    fi
    printf '%s\n' "# Written by lab/lab.sh (LAB_KUBERNETES_GPU): the Kubernetes workload cluster on the same pool." \
      "converged_rebalance_workload_kubeconfig: $workload_kubeconfig" \
      "converged_rebalance_pairs:" "  - {slurm: $LAB_NAME-gpu, kubernetes: $LAB_NAME-k8s-gpu, partition: gpu, resource: nvidia.com/gpu}" \
      >"$STATE/group_vars/all/rebalance.yml"
  fi
  if [[ "$LAB_HA" == 1 ]]; then
    # docs/ha.md: the controllers' shared volume stands in for the NFS mount of the state
    printf '%s\n' "# Written by lab/lab.sh (LAB_HA=1): controller high availability." \
      "converged_ha: true" "keepalived_vip: $LAB_SUBNET_PREFIX.254" \
      "slurm_controller_state_save_location: /srv/shared/slurm-state" \
      "slurm_controller_slurmctld_timeout: 10" >"$STATE/group_vars/all/ha.yml"
  fi
  say "management cluster (real controllers) on $(cat "$dir/mgmt/url"); inventory: $LAB_STATE/capi.capi_machines.yml"
}

# The Kubernetes workload cluster's API (LAB_KUBERNETES_GPU): a real kube-apiserver and etcd from
# $KUBEBUILDER_ASSETS (make kube-assets), on loopback, its address, CA and token in capi/workload/.
start_workload_api() {
  local wdir="$STATE/capi/workload" t0; t0=$(date +%s%N)
  [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" ]] \
    || die "LAB_KUBERNETES_GPU needs a kube-apiserver and etcd in \$KUBEBUILDER_ASSETS ('${KUBEBUILDER_ASSETS:-}'): run 'make kube-assets'"
  workload_api_stop
  rm -rf "$wdir"; mkdir -p "$wdir"; chmod 0700 "$wdir"
  nohup python3 "$REPO_DIR/tests/kubeapi.py" serve "$wdir" >"$STATE/logs/workload-api.log" 2>&1 &
  echo $! >"$STATE/capi/workload.pid"
  local deadline=$(( $(date +%s) + 120 ))
  until [[ -s "$wdir/url" ]]; do
    kill -0 "$(cat "$STATE/capi/workload.pid")" 2>/dev/null && (( $(date +%s) < deadline )) \
      || die_with_log "starting the workload cluster's kube-apiserver" "$STATE/logs/workload-api.log"
    sleep 0.3
  done
  say "the Kubernetes workload cluster's API (kube-apiserver) on $(cat "$wdir/url") in $(elapsed "$t0") s"
}

# The lab's secrets, made once (0600, never printed): the management cluster's admin token, the cluster's
# munge key and the accounting database's password (Secrets metal3/munge-key and metal3/slurmdbd).
lab_secrets() {
  local dir="$STATE/capi"
  mkdir -p "$dir" "$STATE/logs"; chmod 0700 "$dir"
  [[ -f "$dir/token" ]] || (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$dir/token")
  [[ -f "$dir/munge.key" ]] || (umask 077; head -c 1024 /dev/urandom >"$dir/munge.key")
  [[ -f "$dir/slurmdbd.pw" ]] || (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$dir/slurmdbd.pw")
}

# The environment lab/machines.py reads, for what starts it in the background (the host agent).
export_machine_settings() {
  export LAB_NAME LAB_SUITE LAB_FLAVOUR LAB_CONTROLLERS LAB_COMPUTE LAB_LOGIN LAB_GPU LAB_HIGHMEM LAB_SUBNET_PREFIX \
    LAB_CPUS LAB_RAM_MIB LAB_STATE LAB_MUNGE_KEY_SOURCE LAB_CLUSTERS LAB_HA LAB_API_PORT="$API_PORT"
}

mgmt_running() {
  [[ -f "$STATE/capi/mgmt.pid" && -s "$STATE/capi/mgmt/url" ]] && kill -0 "$(cat "$STATE/capi/mgmt.pid")" 2>/dev/null
}

# The management cluster: lab/mgmt.py starts kube-apiserver, etcd and the
# three controller managers on loopback and writes what a site writes (lab/capi_objects.py); the
# host agent (lab/hostagent.py) then boots each host the controllers provision. Returns when every
# Machine the MachineDeployments want is Provisioned; the spare compute hosts are registered after.
mgmt_start() {
  local dir="$STATE/capi" t0 want
  t0=$(date +%s%N)
  local bin
  for bin in kube-apiserver etcd cluster-api-manager capm3-manager baremetal-operator; do
    [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/$bin" ]] \
      || die "the real management cluster needs $bin in \$KUBEBUILDER_ASSETS ('${KUBEBUILDER_ASSETS:-}'): run 'make kube-assets'"
  done
  local keda=()
  if [[ "$LAB_KEDA" == 1 ]]; then
    for bin in keda-operator keda-adapter kube-controller-manager; do
      [[ -x "$KUBEBUILDER_ASSETS/$bin" ]] \
        || die "LAB_KEDA=1 needs $bin in \$KUBEBUILDER_ASSETS ('$KUBEBUILDER_ASSETS'): run 'make kube-assets KEDA=1'"
    done
    keda=(--keda)
  fi
  lab_secrets
  real_hosts >"$dir/hosts.tsv"
  (umask 077; python3 "$LAB_DIR/capi_objects.py" "$dir/hosts.tsv" "$dir/objects.yaml" \
    --spares-out "$dir/spares.yaml" --cluster "$LAB_NAME" --clusters "$LAB_CLUSTERS" --cpus "$LAB_CPUS" \
    --ram-mib "$LAB_RAM_MIB" --api-port "$API_PORT" --munge-key-file "$dir/munge.key" \
    --slurmdbd-password-file "$dir/slurmdbd.pw" --bare-metal "$LAB_BARE_METAL" \
    --bare-metal-gpu "$LAB_BARE_METAL_GPU" --subnet "$LAB_SUBNET_PREFIX" \
    --replicas "compute=$LAB_COMPUTE,gpu=$LAB_GPU" --kubernetes-gpu "$LAB_KUBERNETES_GPU")
  agent_stop
  mgmt_stop quiet
  # the Kubernetes workload cluster's own API: Cluster API follows (and drains) its workers' Nodes there
  local workload=()
  if (( LAB_KUBERNETES_GPU > 0 )); then
    start_workload_api
    workload=(--workload "$LAB_NAME-k8s=$dir/workload/kubeconfig")
  else
    workload_api_stop
  fi
  rm -rf "$dir/mgmt" "$dir/hostagent"; mkdir -p "$dir/mgmt"
  say "starting the management cluster: kube-apiserver, etcd, Cluster API, CAPM3 and the Bare Metal Operator$([[ "$LAB_KEDA" == 1 ]] && echo ", KEDA and the HPA controller") ($(head -c 300 "$KUBEBUILDER_ASSETS/versions" | tr '\n' ' '))"
  setsid nohup python3 "$LAB_DIR/mgmt.py" serve "$dir/mgmt" --port "$API_PORT" --token-file "$dir/token" \
    --objects "$dir/objects.yaml" --logs "$STATE/logs" "${workload[@]}" "${keda[@]}" >"$STATE/logs/mgmt.log" 2>&1 </dev/null &
  echo $! >"$dir/mgmt.pid"
  local deadline=$(( $(date +%s) + 240 ))
  until [[ -s "$dir/mgmt/url" ]]; do
    kill -0 "$(cat "$dir/mgmt.pid")" 2>/dev/null && (( $(date +%s) < deadline )) \
      || die_with_log "starting the management cluster" "$STATE/logs/mgmt.log"
    sleep 0.5
  done
  write_kubeconfig "$(cat "$dir/mgmt/url")" "$dir/mgmt/ca.crt"
  export_machine_settings
  setsid nohup python3 "$LAB_DIR/hostagent.py" --kubeconfig "$dir/kubeconfig" --state "$dir/hostagent" \
    --provision-seconds "$LAB_PROVISION_SECONDS" --deprovision-seconds "$LAB_DEPROVISION_SECONDS" \
    --pid-file "$dir/hostagent.pid" "${workload[@]}" >>"$STATE/logs/hostagent.log" 2>&1 </dev/null &
  say "management cluster on $(cat "$dir/mgmt/url") in $(elapsed "$t0") s ($(grep -c '^kind: BareMetalHost$' "$dir/objects.yaml") hosts registered); host agent running (log ${STATE#"$REPO_DIR"/}/logs/hostagent.log)"
  want=$(( $(wanted_machines | wc -l) + (LAB_BARE_METAL > 0 ? LAB_COMPUTE + LAB_GPU + LAB_KUBERNETES_GPU : 0) ))
  say "the controllers claim, provision and the host agent boots $want hosts"
  python3 - "$dir/kubeconfig" "$want" <<'PY' || die_with_log "provisioning the lab's hosts" "$STATE/logs/hostagent.log"
import json, ssl, sys, time, urllib.request
import yaml
config = yaml.safe_load(open(sys.argv[1]))
server, ca = config["clusters"][0]["cluster"]["server"], config["clusters"][0]["cluster"]["certificate-authority"]
token, want = config["users"][0]["user"]["token"], int(sys.argv[2])
ctx = ssl.create_default_context(cafile=ca)
deadline, phases = time.time() + 300, {}
while True:
    req = urllib.request.Request(server + "/apis/cluster.x-k8s.io/v1beta2/machines",
                                 headers={"Authorization": "Bearer " + token})
    items = json.load(urllib.request.urlopen(req, timeout=10, context=ctx))["items"]
    phases = {m["metadata"]["name"]: (m.get("status") or {}).get("phase") for m in items}
    if sum(1 for p in phases.values() if p in ("Provisioned", "Running")) >= want:
        sys.exit(0)
    if time.time() > deadline:
        sys.exit("only %d of %d Machines Provisioned after 300 s: %s" % (
            sum(1 for p in phases.values() if p in ("Provisioned", "Running")), want, phases))
    time.sleep(1)
PY
  if grep -q '^kind: BareMetalHost$' "$dir/spares.yaml"; then
    python3 "$LAB_DIR/mgmt.py" apply "$dir/kubeconfig" "$dir/spares.yaml"
    say "$(grep -c '^kind: BareMetalHost$' "$dir/spares.yaml") spare compute host(s) registered (LAB_COMPUTE_HOSTS=$(compute_hosts))"
  fi
  say "$want Machines Provisioned in $(elapsed "$t0") s"
}

agent_stop() { stop_pidfile "$STATE/capi/hostagent.pid" || true; }

mgmt_stop() {
  if stop_pidfile "$STATE/capi/mgmt.pid" 15; then
    [[ "${1:-}" == quiet ]] || say "stopped the management cluster"
  fi
}

# Stop the process a pid file names and wait until it has gone ($2 s, 5 by default; a new one may bind the
# same port); the file removed. False when there was none to stop.
stop_pidfile() {
  local pid
  [[ -f "$1" ]] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null || { rm -f "$1"; return 1; }
  kill "$pid"
  for _ in $(seq $(( ${2:-5} * 10 ))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$1"
}

workload_api_stop() {
  stop_pidfile "$STATE/capi/workload.pid" || true
}

# The event path (docs/events.md): ansible-rulebook with the collection's rulebook,
# watching the lab's management cluster and running reconcile.yml (run_playbook) on
# every burst of Machine transitions, until 'lab/lab.sh events-stop' or 'down'.
cmd_events() {
  local inv="$STATE/capi.capi_machines.yml" dir="$STATE/events"
  [[ -f "$inv" ]] || die "no CAPI inventory: run 'make lab' first"
  command -v ansible-rulebook >/dev/null && command -v java >/dev/null \
    || die "the event path needs ansible-rulebook and a Java 17 runtime: run 'make deps'"
  cmd_events_stop quiet
  mkdir -p "$dir"
  local rulebook="${LAB_EVENTS_RULEBOOK:-reconcile}"
  [[ "$rulebook" == reconcile || "$rulebook" == autoscale ]] \
    || die "LAB_EVENTS_RULEBOOK='$rulebook' must be reconcile or autoscale"
  printf '%s\n' "# Written by lab/lab.sh events: the rulebook's variables for this lab." \
    "converged_capi_namespaces: [metal3]" "converged_capi_window: ${LAB_EVENT_WINDOW:-3}" \
    "converged_reconcile_playbook: $REPO_DIR/playbooks/reconcile.yml" \
    "converged_autoscale_playbook: $REPO_DIR/playbooks/autoscale.yml" \
    "converged_autoscale_interval: ${LAB_AUTOSCALE_INTERVAL:-20}" >"$dir/vars.yml"
  # run_playbook runs reconcile.yml with ansible-rulebook's inventory, which it copies: a file
  # alone would lose the lab's group_vars beside it, so give it a directory holding both (the
  # copy follows the links). The source reads the management cluster through the same kubeconfig.
  rm -rf "$dir/inventory"; mkdir -p "$dir/inventory"
  ln -s "$inv" "$dir/inventory/capi.capi_machines.yml"
  ln -s "$STATE/group_vars" "$dir/inventory/group_vars"
  # the log of the path's earlier lives is kept (events-earlier.log); events.log is this one's
  if [[ -s "$STATE/logs/events.log" ]]; then cat "$STATE/logs/events.log" >>"$STATE/logs/events-earlier.log"; fi
  ANSIBLE_CONFIG="$REPO_DIR/ansible.cfg" K8S_AUTH_KUBECONFIG="$(collection_kubeconfig)" \
    setsid nohup ansible-rulebook -r "converged.hpc.$rulebook" -i "$dir/inventory" --vars "$dir/vars.yml" \
    >"$STATE/logs/events.log" 2>&1 </dev/null &
  echo $! >"$dir/rulebook.pid"
  say "event path running: ansible-rulebook -r converged.hpc.$rulebook (pid $(cat "$dir/rulebook.pid"), log ${STATE#"$REPO_DIR"/}/logs/events.log); 'make lab-scale N=...' and the cluster follows"
}

# Every process under PID, children first found, at any depth.
descendants() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do echo "$child"; descendants "$child"; done
}

cmd_events_stop() {
  local pidfile="$STATE/events/rulebook.pid"
  if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    local pid tree; pid=$(cat "$pidfile")
    # its own session (setsid): the rulebook and the reconcile it may be running. ansible-runner
    # starts that ansible-playbook in a session of its own (a pty), out of the group's reach, and
    # with SIGHUP ignored (nohup): left behind, it would hang on its dead terminal and keep the
    # run's Lease renewed. Stop the whole tree.
    tree=$(descendants "$pid")
    kill -TERM -- "-$pid" 2>/dev/null || kill "$pid"
    # shellcheck disable=SC2086
    [[ -z "$tree" ]] || kill -TERM $tree 2>/dev/null || true
    for _ in $(seq 100); do
      ps -p "$(echo "$pid" $tree | tr ' ' ',')" >/dev/null 2>&1 || break  # until none is left
      sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    # shellcheck disable=SC2086
    [[ -z "$tree" ]] || kill -KILL $tree 2>/dev/null || true
    [[ "${1:-}" == quiet ]] || say "stopped the event path (ansible-rulebook)"
  fi
  rm -f "$pidfile"
}

# A lifecycle playbook through the lab's inventory, its full output in logs/NAME.log and what it
# says (its messages, a failure) shown: run_shown NAME [ansible-playbook arguments...]
run_shown() {
  local name="$1" inv="$STATE/capi.capi_machines.yml" rc=0; shift
  [[ -f "$inv" ]] || die "no CAPI inventory: run 'make lab' first"
  mkdir -p "$STATE/logs"
  ansible-playbook -i "$inv" "$REPO_DIR/playbooks/$name.yml" "$@" >"$STATE/logs/$name.log" 2>&1 || rc=$?
  grep -E '^ *"msg"|^ *"(rebalance|move|moved) |^fatal|^failed' "$STATE/logs/$name.log" | sed 's/^ */  /' || true
  (( rc == 0 )) || die "$name.yml failed (exit $rc): ${STATE#"$REPO_DIR"/}/logs/$name.log"
  say "$name.yml done (log ${STATE#"$REPO_DIR"/}/logs/$name.log)"
}

# A move of the pool's hosts between two MachineDeployments (docs/converged.md), e.g.
#   lab/lab.sh move clab-k8s-gpu clab-gpu COUNT=1 | HOSTS=clab-bm-01,... | LABEL=gpu=true
cmd_move() {
  local from="${1:-}" to="${2:-}" which="${3:-COUNT=1}"
  [[ -n "$from" && -n "$to" && "$which" =~ ^(COUNT|HOSTS|LABEL)=.+ ]] || die "usage: make lab-move FROM=<MachineDeployment>" \
    "TO=<MachineDeployment> [COUNT=1 | HOSTS=<host>,... | LABEL=<key>=<value>] (make lab LAB_BARE_METAL=... for a pool)"
  local request
  request=$(python3 -c 'import json, sys
frm, to, which = sys.argv[1:]
key, value = which.split("=", 1)
move = {"from": frm, "to": to}
move[key.lower()] = [h for h in value.split(",") if h] if key == "HOSTS" else (int(value) if value.isdigit() else value)
print(json.dumps({"converged_move": move}))' "$from" "$to" "$which")
  say "moving: ansible-playbook playbooks/move.yml -e '$request'"
  run_shown move -e "$request"
}

# The main job: site.yml through the CAPI inventory, then validate.yml.
cmd_converge() {
  local inv="$STATE/capi.capi_machines.yml" t0
  [[ -f "$inv" ]] || die "no CAPI inventory: run 'make lab' first"
  t0=$(date +%s%N)
  say "converging the cluster: ansible-playbook -i ${inv#"$REPO_DIR"/} playbooks/site.yml"
  local rc=0
  # Progress: one line per play and task as they run; the full log goes to a file, made
  # before the run starts (the loop below may read it before the background job opens it).
  mkdir -p "$STATE/logs"; : >"$STATE/logs/site.log"
  ansible-playbook -i "$inv" "$REPO_DIR/playbooks/site.yml" >"$STATE/logs/site.log" 2>&1 &
  local pid=$! shown=0
  while kill -0 "$pid" 2>/dev/null || [[ $shown -lt $(wc -l <"$STATE/logs/site.log") ]]; do
    local total; total=$(wc -l <"$STATE/logs/site.log")
    if (( total > shown )); then
      sed -n "$((shown + 1)),${total}p" "$STATE/logs/site.log" | grep -E '^(PLAY \[|TASK \[|fatal)' \
        | sed -E 's/ \*+$//; s/^/    /' || true
      shown=$total
    fi
    kill -0 "$pid" 2>/dev/null && sleep 1
  done
  wait "$pid" || rc=$?
  (( rc == 0 )) || die_with_log "site.yml" "$STATE/logs/site.log"
  grep -A6 '^PLAY RECAP' "$STATE/logs/site.log" | grep ' : ok=' | sed 's/^/    /' 
  local converge; converge=$(elapsed "$t0")
  say "site.yml converged $(wc -l <"$STATE/machines.tsv") machines ($LAB_FLAVOUR image) in $converge s"
  if { (( LAB_BARE_METAL_GPU > 0 )) && [[ "$LAB_JOIN_AT_BOOT" == 1 ]]; } || [[ "$LAB_COMPUTE_JOIN_AT_BOOT" == 1 ]]; then
    pool_join_at_boot
  fi
  say "validating: playbooks/validate.yml"
  ansible-playbook -i "$inv" "$REPO_DIR/playbooks/validate.yml" >"$STATE/logs/validate.log" 2>&1 \
    || die_with_log "validate.yml" "$STATE/logs/validate.log"
  sed -n '/TASK \[Report\]/,/^$/p' "$STATE/logs/validate.log" | grep '^ *"' | sed 's/^ */  /'
  say "main job done: converge $converge s ($LAB_FLAVOUR), validated"
}

# LAB_JOIN_AT_BOOT=1 with a GPU pool, LAB_COMPUTE_JOIN_AT_BOOT=1: join_at_boot.yml writes the bootstrap data of
# the MachineDeployments that join at boot (site.yml kept it current already), and their templates name those
# Secrets, as a site makes the change. One with Machines running is made OnDelete first: a new template
# replaces no Machine until one is deleted (rollout.yml deletes them in its order).
pool_join_at_boot() {
  local inv="$STATE/capi.capi_machines.yml" mds=()
  (( LAB_BARE_METAL_GPU > 0 )) && [[ "$LAB_JOIN_AT_BOOT" == 1 ]] && mds+=("$LAB_NAME-gpu")
  [[ "$LAB_COMPUTE_JOIN_AT_BOOT" == 1 ]] && mds+=("$LAB_NAME-compute")
  say "Machines of ${mds[*]} join at boot: join_at_boot.yml, then each template names its Secret <name>-join"
  ansible-playbook -i "$inv" "$REPO_DIR/playbooks/join_at_boot.yml" >"$STATE/logs/join_at_boot.log" 2>&1 \
    || die_with_log "join_at_boot.yml" "$STATE/logs/join_at_boot.log"
  python3 - "$STATE/capi/kubeconfig" "${mds[@]}" <<'PY' || die "naming the join-at-boot Secrets in the templates failed"
import sys
from kubernetes import client, config
api = client.CustomObjectsApi(config.new_client_from_config(sys.argv[1]))
for md in sys.argv[2:]:
    current = api.get_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machinedeployments", md)
    if current["spec"].get("replicas"):
        api.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machinedeployments", md, {
            "spec": {"rollout": {"strategy": {"type": "OnDelete", "rollingUpdate": None}}}})
    api.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machinedeployments", md, {
        "spec": {"template": {"spec": {"bootstrap": {"dataSecretName": md + "-join"}}}}})
PY
}

cmd_ping() {
  local inv="$STATE/capi.capi_machines.yml"
  [[ -f "$inv" ]] || inv="$STATE/hosts.yml"
  [[ -f "$inv" ]] || die "no lab inventory: run 'make lab' first"
  say "ansible ping over SSH through ${inv#"$REPO_DIR"/}"
  ansible -i "$inv" all -m ansible.builtin.ping
}


cmd_status() {
  podman ps -a --filter "label=$LABEL=$LAB_NAME" \
    --format '{{.Names}}\t{{.Status}}\t{{index .Labels "converged.hpc.node-type"}}\t{{index .Labels "converged.hpc.flavour"}}'
}

cmd_down() {
  cmd_events_stop
  agent_stop
  mgmt_stop
  workload_api_stop
  local names attempt
  # podman can stop a container and then fail to remove it while other labs start and stop
  # theirs (a container left Exited, its network then refused): ask again, three times
  for attempt in 1 2 3; do
    names=$(podman ps -a --filter "label=$LABEL=$LAB_NAME" --format '{{.Names}}')
    [[ -z "$names" ]] && break
    # shellcheck disable=SC2086
    if podman rm -f -t 2 $names >/dev/null; then
      say "removed containers: $(echo $names)"
    else
      say "podman rm of $(echo $names) failed (try $attempt of 3)"
      sleep 1
    fi
  done
  for net in $(podman network ls --filter "label=$LABEL=$LAB_NAME" --format '{{.Name}}'); do
    podman network rm "$net" >/dev/null && say "removed network $net"
  done
  for vol in $(podman volume ls --filter "label=$LABEL=$LAB_NAME" --format '{{.Name}}'); do
    podman volume rm "$vol" >/dev/null && say "removed volume $vol"
  done
  # the servers' logs (links into $STATE/capi, removed below) are kept as copies until the next lab:
  # after a failed test they say what the controllers did
  local log
  for log in "$STATE"/logs/*.log; do
    if [[ -L "$log" && -e "$log" ]]; then cp --remove-destination "$(readlink -f "$log")" "$log"; fi
  done
  rm -rf "$STATE/hosts.yml" "$STATE/machines.tsv" "$STATE/capi.capi_machines.yml" "$STATE/group_vars" \
    "$STATE/capi" "$STATE/directory" "$STATE"/.next-* "$SETTINGS_FILE"
  say "lab $LAB_NAME is down (images and the SSH key are kept; 'lab/lab.sh purge' removes them)"
}

cmd_purge() {
  cmd_down
  for flavour in prebaked stock; do
    podman image exists "$(image_name "$flavour")" && podman rmi "$(image_name "$flavour")" >/dev/null
  done
  rm -rf "$STATE"
  say "lab images and state removed"
}

case "${1:-}" in
  deps) cmd_deps ;;
  image) shift; cmd_image "$@" ;;
  up) cmd_up ;;
  directory) cmd_directory ;;
  mgmt) cmd_mgmt ;;
  converge) cmd_converge ;;
  events) cmd_events ;;
  events-stop) cmd_events_stop ;;
  move) shift; cmd_move "$@" ;;
  rebalance) shift; run_shown rebalance "$@" ;;
  ping) cmd_ping ;;
  status) cmd_status ;;
  down) cmd_down ;;
  purge) cmd_purge ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
