"""slurm_queue's parsing of what squeue and scontrol print (Slurm 22.05's formats)."""

import time

import pytest

from ansible_collections.converged.hpc.plugins.modules.slurm_queue import node_record, parse_gres, parse_jobs, parse_running
from ansible_collections.converged.hpc.plugins.module_utils.slurm_text import memory_mib, parse_node, slurm_time


def test_pending_jobs_and_why():
    text = ("12;compute;2;2;0;PartitionConfig;N/A;(null);(null)\n"
            "13_4;compute,gpu;1;8;4G;Resources;gres:gpu:a100:2;(null);gpu&a100|h100\n"
            "14;compute;1;1;2000M;JobHeldUser;N/A;(null);(null)\n"
            "15;compute;1;1;0;ReqNodeNotAvail,_UnavailableNodes:cn-01;N/A;(null);(null)\n"
            "16;compute;1;1;0;Dependency;N/A;afterok:14(unfulfilled);(null)\n"
            # just submitted: the scheduler has not looked at it, but it waits for job 14
            "17;compute;1;1;0;None;N/A;afterok:14(unfulfilled);(null)\n"
            "18;compute;1;1;0;None;N/A;(null);(null)\n"
            # 24.11: a partition of placeholder nodes only, as the scheduler words it
            "19;compute;2;2;0;Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority "
            "partitions;N/A;(null);(null)\n")
    jobs = parse_jobs(text)
    assert [(j["id"], j["nodes"], j["runnable"]) for j in jobs] == [
        ("12", 2, True), ("13_4", 1, True), ("14", 1, False), ("15", 1, True), ("16", 1, False), ("17", 1, False),
        ("18", 1, True), ("19", 2, True)]
    assert jobs[5]["reason"] == "Dependency"
    assert jobs[1]["partitions"] == ["compute", "gpu"] and jobs[1]["features"] == "gpu&a100|h100"
    assert jobs[1]["gres"] == ["gpu:a100:2"] and jobs[0]["gres"] == []
    assert jobs[1]["memory_mib"] == 4096 and jobs[2]["memory_mib"] == 2000 and jobs[0]["features"] == ""


def test_a_line_it_cannot_read_is_an_error():
    with pytest.raises(ValueError, match="unexpected squeue line"):
        parse_jobs("12;compute\n")


def test_nodes_idle_busy_out_of_service():
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_000_000))
    line = ("NodeName=cn-01 Arch=x86_64 CoresPerSocket=2 CPUAlloc=0 CPUTot=2 AvailableFeatures=compute,highmem "
            "ActiveFeatures=compute,highmem State=IDLE+DYNAMIC_NORM Partitions=compute LastBusyTime=%s "
            "SlurmdStartTime=%s Reason=none" % (stamp, stamp))
    rec = node_record(parse_node(line), 1_000_090)
    assert rec == {"name": "cn-01", "state": "IDLE", "flags": ["DYNAMIC_NORM"], "available": True, "busy": False,
                   "features": ["compute", "highmem"], "partitions": ["compute"], "cpus": 2, "idle_seconds": 90}
    # never busy: idle since slurmd started
    rec = node_record(parse_node(line.replace("LastBusyTime=" + stamp, "LastBusyTime=None")), 1_000_030)
    assert rec["idle_seconds"] == 30
    rec = node_record(parse_node(line.replace("IDLE+DYNAMIC_NORM", "IDLE+DRAIN+DYNAMIC_NORM")), 1_000_090)
    assert not rec["available"] and not rec["busy"]
    rec = node_record(parse_node(line.replace("IDLE+DYNAMIC_NORM", "MIXED")), 1_000_090)
    assert rec["busy"] and rec["idle_seconds"] is None
    rec = node_record(parse_node(line.replace("IDLE+DYNAMIC_NORM", "DOWN+NOT_RESPONDING+DYNAMIC_NORM")), 0)
    assert not rec["available"]


def test_sizes_and_times():
    assert (memory_mib("0"), memory_mib("512K"), memory_mib("1.5G"), memory_mib("junk")) == (0, 0, 1536, 0)
    assert slurm_time("None") is None and slurm_time("Unknown") is None


def test_gres_forms():
    assert parse_gres("N/A") == [] and parse_gres("gres/gpu:a100:2,gres/fpga:1") == ["gpu:a100:2", "fpga:1"]


def test_running_jobs_with_their_ends():
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_000_000))
    jobs = parse_running("51;RUNNING;%s;cn-[01-02]\n52_3;COMPLETING;Unknown;cn-03\n53;RUNNING;NONE;(null)\n" % end)
    assert jobs == [{"id": "51", "state": "RUNNING", "end": 1_000_000, "nodes": "cn-[01-02]"},
                    {"id": "52_3", "state": "COMPLETING", "end": None, "nodes": "cn-03"},
                    {"id": "53", "state": "RUNNING", "end": None, "nodes": ""}]
    with pytest.raises(ValueError, match="unexpected squeue line"):
        parse_running("54;RUNNING\n")
