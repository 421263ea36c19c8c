"""PopState with checkpoint runs' names (services/dispatch/pop/state.py): the revive
progress and the end of the log are kept in revive offsets, whatever kind of name the
checkpoints held have (a single checkpoint's revive offset, or run_checkpoint_id)."""

from __future__ import annotations

from services.dispatch.pop.state import PopState
from tests.services.dispatch.pop.test_handles import checkpoint
from tide.format import run_checkpoint_id


def test_progress_is_the_record_of_the_oldest_checkpoint_held() -> None:
    state = PopState(checkpoints_max=1_000)
    state.add(5, checkpoint(0))  # a single checkpoint record at revive offset 5
    for index in range(3):  # a run of 3 at revive offset 9
        state.add(run_checkpoint_id(9, index), checkpoint(1 + index))
    assert state.revive_end == 10
    assert state.progress() == 5
    state.resolve(5)
    assert state.progress() == 9
    state.resolve(run_checkpoint_id(9, 0))
    state.resolve(run_checkpoint_id(9, 2))
    assert state.progress() == 9  # one of the run is still held: read it again at recovery
    state.resolve(run_checkpoint_id(9, 1))
    assert state.progress() == state.revive_end == 10  # all resolved: past everything known
