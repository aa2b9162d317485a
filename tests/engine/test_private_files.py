"""Brisk writes only into folders no other user can change, and trusts only files of its
own there (issue 54 item 8). The tests run as root: "another user" is a file chown'ed to an
unused uid, "others can write" a chmod."""

import os
import stat

import pytest

from brisk.engine.api.errors import BriskError, UnsafeLocation
from brisk.engine.runtime.private_files import (
    check_owned_file,
    ensure_private_dir,
    read_private_file,
    write_private_file,
)

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent

STRANGER = 12345  # a uid and gid no account on the test machine has
needs_posix = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="owners and mode bits are POSIX")


def test_a_missing_folder_is_made_private(tmp_path):
    made = ensure_private_dir(tmp_path / "a" / "data")
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o700


def test_an_own_folder_that_only_we_write_is_accepted(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    assert ensure_private_dir(folder) == folder


def test_a_symlinked_folder_is_refused_and_nothing_is_written_through_it(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "data").symlink_to(elsewhere)
    with pytest.raises(UnsafeLocation, match="symbolic link"):
        write_private_file(tmp_path / "data" / "key", b"secret")
    assert list(elsewhere.iterdir()) == []


@needs_posix
def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    os.chown(folder, STRANGER, STRANGER)
    with pytest.raises(UnsafeLocation, match="belongs to another user"):
        ensure_private_dir(folder)


@needs_posix
@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o703])
def test_a_folder_others_can_write_is_refused_even_when_sticky(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UnsafeLocation, match=f"writable by other users \\(mode {mode:o}\\)"):
        ensure_private_dir(folder)


@needs_posix
def test_a_folder_its_group_can_write_is_refused_when_others_are_in_that_group(tmp_path):
    folder = tmp_path / "team"
    folder.mkdir()
    os.chown(folder, os.geteuid(), STRANGER)  # a group that is not the owner's private one
    folder.chmod(0o770)
    with pytest.raises(UnsafeLocation, match="writable by other users"):
        ensure_private_dir(folder)


def test_a_file_that_is_not_there_is_none_and_an_own_one_is_accepted(tmp_path):
    assert check_owned_file(tmp_path / "nothing") is None
    mine = tmp_path / "mine"
    mine.write_bytes(b"x")
    mine.chmod(0o600)
    assert check_owned_file(mine).st_size == 1


@needs_posix
def test_a_file_of_another_user_is_refused(tmp_path):
    planted = tmp_path / "brisk.db"
    planted.write_bytes(b"theirs")
    os.chown(planted, STRANGER, STRANGER)
    with pytest.raises(UnsafeLocation, match="uid 12345"):
        check_owned_file(planted)


def test_a_symlink_or_a_fifo_is_not_a_file_to_trust(tmp_path):
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeLocation, match="symbolic link"):
        check_owned_file(tmp_path / "link")
    with pytest.raises(UnsafeLocation, match="not a regular file"):
        check_owned_file(tmp_path / "fifo")
    with pytest.raises(UnsafeLocation, match="symbolic link"):
        read_private_file(tmp_path / "link", max_bytes=10)


def test_unsafe_location_is_a_brisk_error_with_one_line():
    error = UnsafeLocation("x is writable by other users")
    assert isinstance(error, BriskError) and "\n" not in str(error)


def test_a_write_replaces_a_planted_link_itself_never_what_it_points_to(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    folder = ensure_private_dir(tmp_path / "data")
    (folder / "key").symlink_to(victim)
    with pytest.raises(UnsafeLocation):
        write_private_file(folder / "key", b"new")
    assert victim.read_bytes() == b"precious"
    (folder / "key").unlink()
    write_private_file(folder / "key", b"new")
    assert read_private_file(folder / "key", max_bytes=3) == b"new"
    assert stat.S_IMODE((folder / "key").stat().st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["key"]  # no temporary file left


def test_a_write_that_must_not_replace_keeps_the_first_file(tmp_path):
    folder = ensure_private_dir(tmp_path / "data")
    write_private_file(folder / "key", b"first", replace=False)
    with pytest.raises(FileExistsError):
        write_private_file(folder / "key", b"second", replace=False)
    assert (folder / "key").read_bytes() == b"first" and len(list(folder.iterdir())) == 1


def test_a_file_larger_than_expected_is_refused(tmp_path):
    big = ensure_private_dir(tmp_path / "data") / "key"
    big.write_bytes(b"x" * 100)
    with pytest.raises(UnsafeLocation, match="100 bytes"):
        read_private_file(big, max_bytes=32)
