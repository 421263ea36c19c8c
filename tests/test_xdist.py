"""tests/_xdist.py: which tests go to one pytest-xdist worker together, and in which order."""

from __future__ import annotations

from pathlib import Path

from tests._xdist import LONGEST_UNITS, SHARED_DIRS, work_unit

ROOT = Path(__file__).resolve().parent.parent


def test_a_module_is_one_unit() -> None:
    assert work_unit("tests/tail/test_follower.py::test_resume") == "tests/tail/test_follower.py"
    assert work_unit("tests/a/test_b.py::TestC::test_d[x-1]") == "tests/a/test_b.py"


def test_a_directory_sharing_a_costly_fixture_is_one_unit() -> None:
    assert work_unit("tests/spark/test_stream.py::test_x") == "tests/spark/"
    assert work_unit("tests/services/console/auth/test_login.py::test_y") == (
        "tests/services/console/"
    )


def test_an_xdist_group_mark_names_its_unit() -> None:
    assert work_unit("tests/a/test_b.py::test_c@heavy") == "heavy"
    # An "@" inside parameters is not a group.
    assert work_unit("tests/a/test_b.py::test_c[a@b]") == "tests/a/test_b.py"


def test_every_named_unit_exists() -> None:
    """A renamed or moved file or directory must be renamed here too."""
    for unit in (*SHARED_DIRS, *LONGEST_UNITS):
        assert (ROOT / unit).exists(), unit
    assert len(set(LONGEST_UNITS)) == len(LONGEST_UNITS)
