"""`--database` in a folder other users can write (issue 54 item 8): the victim runs Brisk
(here as root), the attacker is another uid (files chown'ed to an unused one). Brisk refuses
the folder, a database it does not own, and a planted caches folder, in one sentence, and
writes nothing anywhere."""

import os
import subprocess
import sys

import pytest

from brisk.app.store import Store, StoreUnavailable

STRANGER = 12345  # a uid no account on the test machine has


def brisk_app(tmp_path, *args):
    env = dict(os.environ, BRISK_HOME=str(tmp_path / "home"), QT_QPA_PLATFORM="offscreen")
    return subprocess.run(
        [sys.executable, "-m", "brisk.app.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def shared(tmp_path):
    """A folder like /tmp: anyone may create files in it (sticky, mode 1777)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def test_a_database_in_a_folder_anyone_can_write_is_refused(shared):
    with pytest.raises(StoreUnavailable, match=r"writable by other users \(mode 1777\).*--database"):
        Store(shared / "brisk.db")
    assert list(shared.iterdir()) == []


def test_a_database_another_user_planted_is_refused_and_left_alone(tmp_path):
    planted = tmp_path / "brisk.db"
    planted.write_bytes(b"SQLite format 3\x00 theirs")
    os.chown(planted, STRANGER, STRANGER)
    with pytest.raises(StoreUnavailable, match="belongs to another user"):
        Store(planted)
    assert planted.read_bytes() == b"SQLite format 3\x00 theirs" and planted.stat().st_uid == STRANGER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["brisk.db"]  # no lock, -wal or -shm beside it


def test_a_database_that_is_a_symlink_is_refused(tmp_path):
    Store(tmp_path / "real.db").close()
    (tmp_path / "brisk.db").symlink_to(tmp_path / "real.db")
    with pytest.raises(StoreUnavailable, match="symbolic link"):
        Store(tmp_path / "brisk.db")


def test_a_data_folder_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, STRANGER, STRANGER)
    with pytest.raises(StoreUnavailable, match="belongs to another user"):
        Store(theirs / "brisk.db")
    assert list(theirs.iterdir()) == []


def test_a_missing_data_folder_is_made_private(tmp_path):
    Store(tmp_path / "new" / "brisk.db").close()
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700


def test_brisk_app_refuses_a_shared_folder_in_one_sentence(tmp_path, shared):
    out = brisk_app(tmp_path, "--database", str(shared / "brisk.db"), "--check")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "brisk-app: error:" in out.stderr and "writable by other users (mode 1777)" in out.stderr
    assert list(shared.iterdir()) == []


def test_brisk_app_refuses_a_caches_folder_that_links_elsewhere(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (data / "brisk.db.caches").symlink_to(elsewhere)
    out = brisk_app(tmp_path, "--database", str(data / "brisk.db"), "--check")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "brisk.db.caches is a symbolic link" in out.stderr
    assert list(elsewhere.iterdir()) == []
