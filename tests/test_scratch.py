"""The tests' scratch in memory where there is room (tests/scratch.py), and nowhere else."""

from __future__ import annotations

from pathlib import Path

from tests import scratch


def test_a_tmpfs_with_room_is_chosen() -> None:
    assert scratch.chosen({}, "tmpfs", scratch.ROOM, True) == Path("/dev/shm")


def test_a_disk_a_full_tmpfs_or_one_not_writable_is_not() -> None:
    assert scratch.chosen({}, "ext4", 100 * scratch.ROOM, True) is None
    assert scratch.chosen({}, None, 100 * scratch.ROOM, True) is None
    assert scratch.chosen({}, "tmpfs", scratch.ROOM - 1, True) is None
    assert scratch.chosen({}, "tmpfs", scratch.ROOM, False) is None


def test_a_temp_directory_someone_chose_is_kept() -> None:
    assert scratch.chosen({"TMPDIR": "/var/tmp"}, "tmpfs", 100 * scratch.ROOM, True) is None

