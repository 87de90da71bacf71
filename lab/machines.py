"""The lab's "bare-metal machines": Debian systemd containers under podman (LAB_SUITE: trixie, Debian
13 with Slurm 24.11, or bookworm, Debian 12 with Slurm 22.05).

One place that boots, checks and removes them, used by lab/lab.sh (`up`) and by the
host agent (lab/hostagent.py: a host the Bare Metal Operator provisions is booted), so adding a
machine goes one way: lab.sh or the host agent -> this module -> podman.

    python3 lab/machines.py start NAME IP NODE_TYPE   boot (or reuse) one machine
    python3 lab/machines.py ready NAME IP             wait until sshd answers and systemd has booted
    python3 lab/machines.py reinstall NAME IP NODE_TYPE
        the machine made again from LAB_SUITE's image, its name, address and data disks kept (an upgrade
        of a controller, the accounting host or a login node by reinstalling it)
    python3 lab/machines.py machine-add MACHINE NODE_TYPE [USER_DATA_FILE]
        boot a new machine for a Cluster API Machine; prints "hostname address cpus ram_mib".
        USER_DATA_FILE: the Machine's bootstrap data, handed to cloud-init at first boot
        as a NoCloud seed (as Metal3 hands it to the host's config drive)
    python3 lab/machines.py machine-boot HOST IP NODE_TYPE [USER_DATA_FILE]
        boot a pool's registered host (a BareMetalHost: its name and address) anew with the image
        of NODE_TYPE, as Metal3 writes a claimed host's disk; prints "hostname address cpus ram_mib"
    python3 lab/machines.py machine-remove HOSTNAME   remove it (the host is "deprovisioned")

Settings come from the environment, as lab/lab.sh exports them from lab/lab.conf.
"""

import fcntl
import io
import os
import re
import subprocess
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the images of each suite (lab/lab.sh builds them)
IMAGE_REPOS = {"trixie": "localhost/converged-hpc/debian13", "bookworm": "localhost/converged-hpc/debian12",
               "forky": "localhost/converged-hpc/debian14"}
LABEL = "converged.hpc.lab"
SSH_USER = "admin"
# Name prefixes and address ranges by node type (lab/lab.conf): controllers .11-.19,
# compute .21-.200, GPU .201-.230, highmem .231-.253; login .7-.9.
LAYOUT = {"controller": ("ctl", 10, 19), "compute": ("cn", 20, 200), "gpu": ("gpu", 200, 230),
          "highmem": ("hm", 230, 253), "login": ("login", 6, 9)}
# A lab GPU machine's fake GPUs: character devices (/dev/null's) named as the NVIDIA driver
# names them, so that Slurm's GRES scheduling and binding run for real; its Machines declare
# them with the GRES annotation (lab/capi_objects.py).
LAB_GPUS = 2
GPU_GRES = "gpu:lab:%d" % LAB_GPUS
# A highmem machine declares this many times the lab's RAM.
HIGHMEM_FACTOR = 2


def read_user_data(path):
    """The bootstrap data a Machine's host is given (bytes), or None without a file."""
    if not path:
        return None
    with open(path, "rb") as fh:
        return fh.read()


def image_build_files(build):
    """What an image build (the ?build= of a template's image URL, lab/hostagent.py) puts on a host's disk: its
    name in /etc/converged-hpc/image-build; a build whose name holds "slurmd-fails" is an image whose slurmd
    never starts (a unit drop-in), the broken image a rollout must stop on (tests/e2e/test_rollout.py)."""
    if not build:
        return {}
    if not re.match(r"^[A-Za-z0-9._-]{1,64}$", build):
        raise RuntimeError("machine-boot: image build '%s' is not a name the lab can use" % build)
    files = {"etc/converged-hpc/image-build": (build + "\n").encode()}
    if "slurmd-fails" in build:
        files["etc/systemd/system/slurmd.service.d/lab-image-build.conf"] = \
            b"# lab/machines.py: this image build's slurmd never starts\n[Service]\nExecStartPre=/bin/false\n"
    return files


def ram_of(node_type, ram_mib):
    return ram_mib * HIGHMEM_FACTOR if node_type == "highmem" else ram_mib


class Lab:
    def __init__(self, env=None):
        env = os.environ if env is None else env
        self.name = env.get("LAB_NAME", "clab")
        self.flavour = env.get("LAB_FLAVOUR", "prebaked")
        self.suite = env.get("LAB_SUITE", "trixie")
        if self.suite not in IMAGE_REPOS:
            raise SystemExit("LAB_SUITE=%r is not one of %s" % (self.suite, ", ".join(sorted(IMAGE_REPOS))))
        self.subnet = env.get("LAB_SUBNET_PREFIX", "10.89.50")
        self.cpus = int(env.get("LAB_CPUS", "2"))
        self.ram_mib = int(env.get("LAB_RAM_MIB", "2000"))
        state = env.get("LAB_STATE", ".lab")
        self.state = state if os.path.isabs(state) else os.path.join(REPO, state)
        self.network = self.name + "-net"
        self.image = "%s:%s" % (IMAGE_REPOS[self.suite], self.flavour)
        self.key = os.path.join(self.state, "ssh", "id_ed25519")

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def say(message):
        print("[lab] %s" % message, file=sys.stderr, flush=True)

    @staticmethod
    def podman(*args, check=True):
        proc = subprocess.run(["podman"] + list(args), capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError("podman %s failed: %s" % (" ".join(args[:2]), proc.stderr.strip()[-500:]))
        return proc

    def inspect(self, name, template):
        return self.podman("inspect", "-f", template, name).stdout.strip()

    def _image_id(self):
        return self.podman("image", "inspect", "-f", "{{.Id}}", self.image).stdout.strip()

    def run_flags(self, node_type):
        """Capabilities by machine role (docs/lab.md says why); on forky also what its systemd needs to boot."""
        flags = self.role_flags(node_type)
        if self.suite == "forky":
            # systemd 258 and later refuse a cgroup v1 hierarchy, which is what podman gives on this host (cgroups
            # v1, hybrid): the machine mounts the cgroup2 hierarchy in a cgroup namespace of its own before
            # systemd starts (init_command), which takes a privileged container
            flags = [f for f in flags if f != "--privileged"] + ["--privileged", "--cgroupns=private"]
        return flags

    def init_command(self):
        """What the machine runs as PID 1: systemd (on forky after mounting cgroup2 over podman's cgroup v1)."""
        if self.suite == "forky":
            return ["/bin/sh", "-c", "umount -R /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup "
                    "&& exec /sbin/init"]
        return ["/sbin/init"]

    def role_flags(self, node_type):
        """Capabilities by machine role (docs/lab.md says why)."""
        if node_type == "controller":  # keepalived's VRRP and VIP; nfs-ganesha; the shared volume
            return ["--cap-add", "NET_ADMIN", "--cap-add", "NET_RAW", "--cap-add", "DAC_READ_SEARCH",
                    "-v", "%s-shared:/srv/shared" % self.name]
        if node_type in ("compute", "highmem"):  # Slurm's cgroup plugins (production defaults) need it
            return ["--privileged"]
        if node_type == "gpu":  # and its fake GPUs
            # (--device is ignored beside --privileged: a bind mount of /dev/null names each one)
            return ["--privileged"] + [arg for i in range(LAB_GPUS) for arg in ("-v", "/dev/null:/dev/nvidia%d" % i)]
        if node_type == "accounting":  # its data disk: the database and its dumps outlive a reinstall
            return [arg for path, volume in self.data_volumes(node_type) for arg in ("-v", "%s:%s" % (volume, path))]
        if node_type == "directory":  # slapd restarts cleanly
            return ["--cap-add", "SYS_PTRACE"]
        return []

    def data_volumes(self, node_type):
        """(path, volume) of a node type's data disk: what a host reinstalled with another image keeps."""
        if node_type == "accounting":
            return [("/var/lib/mysql", "%s-accounting-db" % self.name),
                    ("/var/backups/slurm-accounting", "%s-accounting-dumps" % self.name)]
        return []

    # ------------------------------------------------------------------ machines
    def reinstall(self, name, ip, node_type):
        """The host reinstalled with this lab's image (LAB_SUITE: another Debian, another Slurm): its name, address
        and data disks kept (the controllers' shared volume, the accounting host's database and dumps), as a site
        reinstalls a controller or its database host to upgrade it. Its munge key and configuration come back by
        a converge, as on a new host."""
        with open(os.path.join(self.state, ".machines.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.podman("rm", "-f", "-t", "10", name, check=False)
            self.start(name, ip, node_type)
        self.ready(name, ip)
        self.say("%s reinstalled with %s (%s)" % (name, self.image, node_type))

    def start(self, name, ip, node_type, user_data=None, files=None):
        """Boot a machine, or reuse it when it runs the lab's current image. user_data (bytes): the
        bootstrap data cloud-init applies at the machine's first boot; a reused machine has had it. files:
        {path in the machine: bytes} written on its disk before it first boots (an image's build)."""
        if self.podman("container", "exists", name, check=False).returncode == 0:
            image = self.inspect(name, "{{.ImageName}}")
            if image != self.image:
                self.say("%s runs %s, the lab wants %s: replacing it" % (name, image, self.image))
                self.podman("rm", "-f", name)
            elif self.inspect(name, "{{.Image}}") != self._image_id():
                self.say("%s runs an older build of %s: replacing it" % (name, self.image))
                self.podman("rm", "-f", name)
            elif self.inspect(name, "{{.State.Status}}") == "running":
                self.say("%s already running (%s), reused" % (name, ip))
                return
            else:
                self.podman("start", name)
                self.say("%s restarted (%s)" % (name, ip))
                return
        for _path, volume in self.data_volumes(node_type):
            if self.podman("volume", "exists", volume, check=False).returncode != 0:
                self.podman("volume", "create", "--label", "%s=%s" % (LABEL, self.name), volume)
        self.podman("create", "--name", name, "--hostname", name, "--network", self.network, "--ip", ip,
                    "--systemd=always", "--label", "%s=%s" % (LABEL, self.name),
                    "--label", "converged.hpc.node-type=" + node_type,
                    "--label", "converged.hpc.flavour=" + self.flavour,
                    "-v", "%s.pub:/home/%s/.ssh/authorized_keys:ro" % (self.key, SSH_USER),
                    *self.run_flags(node_type), self.image, *self.init_command())
        if user_data is not None or files:
            self.seed(name, user_data, files)
        self.podman("start", name)
        self.say("%s booted (%s, %s%s)" % (name, node_type, ip, ", bootstrap data for cloud-init" if user_data else ""))

    def seed(self, name, user_data, files=None):
        """Put a NoCloud seed (meta-data, the user-data) on the machine's disk before it boots: its
        cloud-init applies it once (the instance id is the machine's name). And files ({path: bytes})."""
        seed = {}
        if user_data is not None:
            seed = {"meta-data": ("instance-id: %s\nlocal-hostname: %s\n" % (name, name)).encode(),
                    "user-data": user_data}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            dirs = [("var/lib/cloud", 0o755), ("var/lib/cloud/seed", 0o755),
                    ("var/lib/cloud/seed/nocloud", 0o700)] if seed else []
            for path in sorted(files or {}):
                parts = path.split("/")[:-1]
                dirs += [("/".join(parts[:i + 1]), 0o755) for i in range(len(parts))]
            for path, mode in dict.fromkeys(dirs):
                info = tarfile.TarInfo(path)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, time.time()
                tar.addfile(info)
            for base, data in seed.items():
                info = tarfile.TarInfo("var/lib/cloud/seed/nocloud/" + base)
                info.size, info.mode, info.mtime = len(data), 0o600, time.time()  # it may hold secrets
                tar.addfile(info, io.BytesIO(data))
            for path, data in sorted((files or {}).items()):
                info = tarfile.TarInfo(path)
                info.size, info.mode, info.mtime = len(data), 0o644, time.time()
                tar.addfile(info, io.BytesIO(data))
        proc = subprocess.run(["podman", "cp", "-", "%s:/" % name], input=buf.getvalue(), capture_output=True,
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError("podman cp of %s's bootstrap data failed: %s"
                               % (name, proc.stderr.decode(errors="replace").strip()[-500:]))

    def ready(self, name, ip, timeout=90):
        """Ready means: sshd accepts the lab key AND systemd has finished booting the machine."""
        ssh = ["ssh", "-n", "-i", self.key, "-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "%s@%s" % (SSH_USER, ip), "timeout 60 systemctl is-system-running --wait 2>/dev/null || true"]
        deadline, state = time.time() + timeout, ""
        while time.time() < deadline:
            proc = subprocess.run(ssh, capture_output=True, text=True, check=False)
            state = proc.stdout.strip()
            if proc.returncode == 0 and state in ("running", "degraded"):
                return
            time.sleep(0.5)
        raise RuntimeError("%s (%s) was not ready within %d s (sshd or boot: %s; podman logs %s)"
                           % (name, ip, timeout, state or "no SSH", name))

    def _tsv(self):
        return os.path.join(self.state, "machines.tsv")

    def _known(self):
        try:
            with open(self._tsv()) as fh:
                return {line.split()[0] for line in fh if line.strip()}
        except FileNotFoundError:
            return set()

    def add(self, machine, node_type, user_data_file=None):
        """Boot a new machine for a Cluster API Machine: (hostname, address, cpus, ram_mib)."""
        user_data = read_user_data(user_data_file)
        if node_type not in LAYOUT:
            raise RuntimeError("machine-add: node type '%s' has no lab machines" % node_type)
        prefix, base, last = LAYOUT[node_type]
        os.makedirs(self.state, exist_ok=True)
        with open(os.path.join(self.state, ".machines.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # Names and addresses are never reused while the lab lives: a new host on an old
            # address would meet SSH connections still multiplexed to the removed one.
            counter = os.path.join(self.state, ".next-" + prefix)
            try:
                with open(counter) as fh:
                    index = int(fh.read().strip() or 1)
            except FileNotFoundError:
                index = 1
            known = self._known()

            def taken(i):
                name = "%s-%s-%02d" % (self.name, prefix, i)
                return name in known or self.podman("container", "exists", name, check=False).returncode == 0
            while taken(index):
                index += 1
            if base + index > last:
                raise RuntimeError("machine-add: the lab network has no address left for %s machines" % node_type)
            with open(counter, "w") as fh:
                fh.write("%d\n" % (index + 1))
            name = "%s-%s-%02d" % (self.name, prefix, index)
            ip = "%s.%d" % (self.subnet, base + index)
            self.start(name, ip, node_type, user_data)
            with open(self._tsv(), "a") as fh:
                fh.write("%s %s %s\n" % (name, ip, node_type))
        self.ready(name, ip)
        self.say("%s booted for Machine %s" % (name, machine))
        return name, ip, self.cpus, ram_of(node_type, self.ram_mib)

    def boot(self, host, ip, node_type, user_data_file=None):
        """A pool's host claimed by a Machine: its disk written anew (the container made again) with the
        node type's image and the Machine's bootstrap data: (hostname, address, cpus, ram_mib). Any node
        type: the address is the host's, not one of a node type's range."""
        user_data = read_user_data(user_data_file)
        if not re.match(r"^[a-z0-9][a-z0-9-]*$", node_type):
            raise RuntimeError("machine-boot: node type '%s' is not a label value the lab can use" % node_type)
        files = image_build_files(os.environ.get("LAB_IMAGE_BUILD", ""))
        os.makedirs(self.state, exist_ok=True)
        with open(os.path.join(self.state, ".machines.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.podman("rm", "-f", "-t", "2", host, check=False)
            self.start(host, ip, node_type, user_data, files)
            with open(self._tsv(), "a") as fh:
                fh.write("%s %s %s\n" % (host, ip, node_type))
        self.ready(host, ip)
        self.say("%s provisioned as %s" % (host, node_type))
        return host, ip, self.cpus, ram_of(node_type, self.ram_mib)

    def remove(self, name):
        with open(os.path.join(self.state, ".machines.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.podman("rm", "-f", "-t", "2", name, check=False)
            if os.path.exists(self._tsv()):
                with open(self._tsv()) as fh:
                    keep = [line for line in fh if line.split() and line.split()[0] != name]
                with open(self._tsv() + ".new", "w") as fh:
                    fh.writelines(keep)
                os.replace(self._tsv() + ".new", self._tsv())
        self.say("%s removed (its Machine was deleted)" % name)


def main(argv):
    lab = Lab()
    usage = next(p for p in __doc__.split("\n\n") if p.lstrip().startswith("python3 lab/machines.py"))
    if len(argv) < 2:
        print(usage, file=sys.stderr)
        return 2
    command, args = argv[1], argv[2:]
    try:
        if command == "start" and len(args) == 3:
            lab.start(*args)
        elif command == "reinstall" and len(args) == 3:
            lab.reinstall(*args)
        elif command == "ready" and len(args) == 2:
            lab.ready(*args)
        elif command == "machine-add" and len(args) in (2, 3):
            print("%s %s %d %d" % lab.add(*args))
        elif command == "machine-boot" and len(args) in (3, 4):
            print("%s %s %d %d" % lab.boot(*args))
        elif command == "machine-remove" and len(args) == 1:
            lab.remove(args[0])
        else:
            print(usage, file=sys.stderr)
            return 2
    except RuntimeError as exc:
        print("[lab] ERROR: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
