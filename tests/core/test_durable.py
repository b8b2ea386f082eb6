"""Durable small files: votes and the node id are fsynced before the rename, and the directory
after it; a crash at any step leaves the old file or the new one, and a vote that was granted
is always on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exo_core.durable import crash_hook
from exo_core.eventlog import EventLog
from exo_core.ids import NodeId
from exo_core.node import _persistent_node_id
from exo_core.votes import VoteBook
from exo_core.wire import VoteRequest


class Syscalls:
    """Records fsyncs (by what the descriptor names) and renames, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        fsync, replace = os.fsync, os.replace

        def recording_fsync(fd: int) -> None:
            self.calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            fsync(fd)

        def recording_replace(src: str | Path, dst: str | Path) -> None:
            self.calls.append(("rename", str(dst)))
            replace(src, dst)

        monkeypatch.setattr(os, "fsync", recording_fsync)
        monkeypatch.setattr(os, "replace", recording_replace)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


def vote(term: int, candidate: str = "node-a") -> VoteRequest:
    return VoteRequest(term=term, candidate=NodeId(candidate), last_term=0, last_index=0)


def test_a_vote_is_fsynced_renamed_and_its_directory_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = Syscalls(monkeypatch)
    assert VoteBook(tmp_path / "vote.json").decide(vote(5), 0, 0).granted
    assert calls.kinds() == ["fsync", "rename", "fsync"]
    assert ".vote.json.tmp" in calls.calls[0][1]  # the temporary file, before the rename
    assert calls.calls[2][1] == str(tmp_path)  # the directory, after it


def test_the_node_id_file_is_written_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = Syscalls(monkeypatch)
    node_id = _persistent_node_id(tmp_path)
    assert calls.kinds() == ["fsync", "rename", "fsync"]
    assert _persistent_node_id(tmp_path) == node_id


def test_a_new_event_log_fsyncs_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = Syscalls(monkeypatch)
    EventLog(tmp_path / "events.log").close()
    assert ("fsync", str(tmp_path)) in calls.calls


class Crash(Exception):
    pass


@pytest.mark.parametrize("point", ["write", "written", "synced", "renamed"])
def test_a_crash_inside_a_vote_write_never_loses_a_granted_vote(tmp_path: Path, point: str) -> None:
    path = tmp_path / "vote.json"
    book = VoteBook(path)
    assert book.decide(vote(3, "node-a"), 0, 0).granted

    def crash(name: str, _path: Path) -> None:
        if name == point:
            raise Crash(name)

    with crash_hook(crash), pytest.raises(Crash):
        book.decide(vote(4, "node-b"), 0, 0)  # never answered: the process died
    after = VoteBook(path)
    # The granted vote (term 3) or, once renamed, the new one; never nothing or a mix.
    if point == "renamed":
        assert (after.term, after.voted_for) == (4, "node-b")
    else:
        assert (after.term, after.voted_for) == (3, "node-a")
    # And the restarted node refuses a second candidate in the vote's term.
    assert not after.decide(vote(after.term, "node-c"), 0, 0).granted


def test_a_vote_that_cannot_be_written_is_not_granted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = VoteBook(tmp_path / "vote.json")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(os, "fsync", full)
    answer = book.decide(vote(7), 0, 0)
    assert not answer.granted and "cannot record" in answer.reason
    assert book.term == 0 and book.voted_for is None
    monkeypatch.undo()
    assert book.decide(vote(7, "node-z"), 0, 0).granted
