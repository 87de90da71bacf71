"""slurm_versions: the release that wrote slurmctld's saved state, read from a state file's header, and
the version a Slurm program prints."""

import os

import pytest

from ansible_collections.converged.hpc.plugins.modules.slurm_versions import state_release, version_of

# the first bytes of node_state files, as the releases wrote them in the lab: a packed string
# ("PROTOCOL_VERSION", its NUL counted) and the protocol version, network order
HEADERS = {
    "24.11": "0000001150524f544f434f4c5f56455253494f4e002a00000000006b08420f00",  # Debian 13, 24.11.5
}


@pytest.mark.parametrize("release", sorted(HEADERS))
def test_the_release_that_wrote_a_state_file(tmp_path, release):
    path = tmp_path / "node_state"
    path.write_bytes(bytes.fromhex(HEADERS[release]) + b"\0" * 64)
    assert state_release(str(path)) == release


@pytest.mark.parametrize("content", [b"", b"\0\0\0\x11PROTO", b"\xff\xff\xff\xffPROTOCOL_VERSION\0\x2a\0",
                                     b"\0\0\0\x11PROTOCOL_VERSION\0\x07\0"])
def test_a_header_it_cannot_read_is_no_release(tmp_path, content):
    path = tmp_path / "job_state"
    path.write_bytes(content)
    assert state_release(str(path)) is None


def test_a_missing_state_file_is_no_release(tmp_path):
    assert state_release(str(tmp_path / "none")) is None


def test_the_version_a_program_prints_with_a_probe_configuration(tmp_path):
    # as sinfo and slurmdbd from 23.11: without a configuration they fail before printing their version
    program = tmp_path / "sinfo"
    program.write_text("#!/bin/sh\ngrep -q ^ClusterName= \"$SLURM_CONF\" || exit 1\n"
                       "[ \"$(stat -c %a \"$(dirname \"$SLURM_CONF\")/slurmdbd.conf\")\" = 600 ] || exit 1\n"
                       "echo 'slurm-wlm 24.11.5'\n")
    os.chmod(str(program), 0o755)
    assert version_of(str(program)) == "24.11.5"
    program.write_text("#!/bin/sh\necho 'not slurm'\n")
    assert version_of(str(program)) is None
    assert version_of(str(tmp_path / "absent")) is None
