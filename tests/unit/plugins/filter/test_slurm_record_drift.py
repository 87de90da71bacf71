"""Where Slurm's record of a dynamic node differs from the node's declaration."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.converged.hpc.plugins.filter.slurm_record_drift import slurm_record_drift

# scontrol show node --oneliner of Slurm 22.05, a GPU node with MemSpecLimit
GPU = ("NodeName=hlab-gpu-01 Arch=x86_64 CoresPerSocket=2 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.03 "
       "AvailableFeatures=gpu ActiveFeatures=gpu Gres=gpu:lab:2(S:0) NodeAddr=10.89.88.201 "
       "NodeHostName=hlab-gpu-01 Version=22.05.8 OS=Linux 6.1.0 RealMemory=2000 AllocMem=0 FreeMem=21000 "
       "Sockets=1 Boards=1 CoreSpecCount=0 MemSpecLimit=256 State=IDLE+DYNAMIC_NORM ThreadsPerCore=1 TmpDisk=0 "
       "Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2026-11-25T16:00:00 "
       "SlurmdStartTime=2026-11-25T16:00:01 LastBusyTime=2026-11-25T16:00:02 CfgTRES=cpu=2,mem=2000M,billing=2 "
       "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")
# one without GRES or memory kept for the OS
PLAIN = ("NodeName=hlab-cn-01 Arch=x86_64 CoresPerSocket=2 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.00 "
         "AvailableFeatures=compute ActiveFeatures=compute Gres=(null) NodeAddr=10.89.88.21 RealMemory=2000 "
         "AllocMem=0 FreeMem=21000 Sockets=1 Boards=1 State=IDLE+DYNAMIC_NORM ThreadsPerCore=1 TmpDisk=0")


def test_a_record_as_declared_has_no_drift():
    assert slurm_record_drift(GPU, {"RealMemory": 2000, "MemSpecLimit": 256, "Gres": "gpu:lab:2", "CPUs": 2}) == []
    assert slurm_record_drift(PLAIN, {"RealMemory": "2000", "MemSpecLimit": 0, "Gres": "", "CPUs": "2"}) == []


def test_each_changed_value_is_named_with_both_sides():
    assert slurm_record_drift(GPU, {"RealMemory": 1800, "MemSpecLimit": 512, "Gres": "gpu:lab:1", "CPUs": 1}) == [
        "RealMemory 2000 -> 1800", "MemSpecLimit 256 -> 512", "Gres gpu:lab:2 -> gpu:lab:1", "CPUs 2 -> 1"]
    # kept for the OS or GRES newly declared, or no longer
    assert slurm_record_drift(PLAIN, {"MemSpecLimit": 128, "Gres": "gpu:lab:2"}) == [
        "MemSpecLimit 0 -> 128", "Gres none -> gpu:lab:2"]
    assert slurm_record_drift(GPU, {"MemSpecLimit": 0, "Gres": ""}) == ["MemSpecLimit 256 -> 0", "Gres gpu:lab:2 -> none"]


def test_several_gres_compare_in_any_order_without_socket_affinity():
    line = PLAIN.replace("Gres=(null)", "Gres=gpu:a100:4(S:0-1),shard:8")
    assert slurm_record_drift(line, {"Gres": "shard:8,gpu:a100:4"}) == []
    assert slurm_record_drift(line, {"Gres": "gpu:a100:4"}) == ["Gres gpu:a100:4,shard:8 -> gpu:a100:4"]


def test_only_the_declared_keys_are_compared():
    assert slurm_record_drift(GPU, {}) == []
    assert slurm_record_drift(GPU, {"RealMemory": 2000}) == []


def test_what_it_cannot_compare_is_refused_by_name():
    with pytest.raises(AnsibleFilterError, match="cannot compare Weight"):
        slurm_record_drift(GPU, {"Weight": 10})
    with pytest.raises(AnsibleFilterError, match="'Node hlab-cn-09 not found' is not a node's line"):
        slurm_record_drift("Node hlab-cn-09 not found", {"RealMemory": 2000})
    with pytest.raises(AnsibleFilterError, match="expects a dict"):
        slurm_record_drift(GPU, ["RealMemory"])


def test_a_gres_declared_without_a_type_is_the_typed_one_autodetection_recorded():
    line = PLAIN.replace("Gres=(null)", "Gres=gpu:a100:4(S:0-1)")
    assert slurm_record_drift(line, {"Gres": "gpu:4"}) == []
    assert slurm_record_drift(line, {"Gres": "gpu:2"}) == ["Gres gpu:a100:4 -> gpu:2"]
    mixed = PLAIN.replace("Gres=(null)", "Gres=gpu:a100:2(S:0),gpu:v100:2(S:1)")
    assert slurm_record_drift(mixed, {"Gres": "gpu:4"}) == []
    # a typed declaration is compared type by type
    assert slurm_record_drift(line, {"Gres": "gpu:h100:4"}) == ["Gres gpu:a100:4 -> gpu:h100:4"]
    assert slurm_record_drift(line, {"Gres": "gpu:4,shard:8"}) == ["Gres gpu:a100:4 -> gpu:4,shard:8"]
