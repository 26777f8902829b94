"""A restore that CRIU fails is tried once more from the same images (engines/runc/criu.py).

CRIU failed one restore in a full test run ("Cannot apply seals on memfd") and never again
in 170 tries: the session it failed was lost. A CRIU that fails the first restore it is
asked for, and only that one, stands in for such a failure here; one that fails every
restore checks that a failure that repeats is still reported and loses nothing.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from deskbox_server.engines.runc.criu import CRIU_WRAPPER, Criu, hibernate_sandbox, restore_sandbox
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.errors import SessionFailed

from .test_checkpoint import screen_and_mark

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]


def failing_criu(directory: Path, times: int, take_an_image: bool = False) -> Criu:
    """The real CRIU, except that its first ``times`` runs for a restore exit at once with
    an error (runc's command line, its parent's, says what it runs for); with
    ``take_an_image``, after removing runc's file of the images being restored (as deleting
    their snapshot meanwhile would)."""
    count = directory / "restores-failed"
    wrapper = directory / "criu-failing-restores"
    take = ("rm -f \"$(tr '\\0' '\\n' < /proc/$PPID/cmdline | sed -n '/^--image-path$/{n;p;}')"
            "/descriptors.json\"; " if take_an_image else "")
    wrapper.write_text(
        "#!/bin/sh\n"
        f"if grep -qa restore /proc/$PPID/cmdline && [ \"$(wc -c < {count})\" -lt {times} ]; "
        f"then printf x >> {count}; {take}"
        "echo 'Error (criu/test.c:1): a failure of the test' >&2; exit 1; fi\n"
        f'exec {CRIU_WRAPPER} "$@"\n'
    )
    wrapper.chmod(0o755)
    count.write_text("")
    return Criu(wrapper)


def hibernated_with_mark(sandbox: RuncSandbox, mark: str) -> bytes:
    """The sandbox hibernated (its processes end) with ``mark`` on its clipboard; the
    screen it showed."""
    screen, _ = screen_and_mark(sandbox, mark)
    hibernate_sandbox(sandbox, Criu())
    sandbox.release_init()
    return screen


def test_a_failed_restore_is_tried_again_and_the_sandbox_comes_back(
    sandbox: RuncSandbox, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = hibernated_with_mark(sandbox, "kept through a failed restore")

    with caplog.at_level(logging.WARNING, logger="deskbox.runc"):
        restore_sandbox(sandbox, failing_criu(tmp_path, times=1))

    assert (tmp_path / "restores-failed").read_text() == "x"  # the first try did fail
    assert any("trying once more" in record.getMessage() for record in caplog.records)
    state = Runc().state(sandbox.container_id)
    assert state is not None and state.status == "running"
    assert not sandbox.hibernate_archive.exists()
    after, mark = screen_and_mark(sandbox, None)
    assert mark == "kept through a failed restore"
    assert after == before


def test_a_restore_that_fails_twice_is_reported_and_its_checkpoint_kept(
    sandbox: RuncSandbox, tmp_path: Path
) -> None:
    mark = "kept through two failed restores"
    hibernated_with_mark(sandbox, mark)

    with pytest.raises(SessionFailed) as raised:
        restore_sandbox(sandbox, failing_criu(tmp_path, times=2))
    assert "tried twice" in raised.value.message, raised.value.message
    assert (tmp_path / "restores-failed").read_text() == "xx"
    assert Runc().state(sandbox.container_id) is None  # nothing of either try runs
    assert sandbox.hibernate_archive.is_file()  # below the API, it can still be restored

    restore_sandbox(sandbox, Criu())
    assert screen_and_mark(sandbox, None)[1] == mark


class _RuncThatCannotDelete(Runc):
    """The real runc, except that a delete fails as runc's own would (a container it
    cannot remove)."""

    def delete(self, container_id: str) -> None:
        raise SessionFailed(f"runc could not delete {container_id}: a failure of the test")


def test_a_delete_failing_between_the_tries_reports_crius_error_too(
    sandbox: RuncSandbox, tmp_path: Path
) -> None:
    mark = "kept through a failed delete"
    hibernated_with_mark(sandbox, mark)
    options = sandbox.options
    sandbox.options = replace(options, runc=_RuncThatCannotDelete())
    try:
        with pytest.raises(SessionFailed) as raised:
            restore_sandbox(sandbox, failing_criu(tmp_path, times=1))
    finally:
        sandbox.options = options
    message = raised.value.message
    # CRIU's reason first (the wrapper's failure reaches runc as a broken version check),
    # then why there was no second try.
    assert message.startswith("CRIU could not restore the sandbox: "), message
    assert message.endswith("(not tried again: runc could not delete "
                            f"{sandbox.container_id}: a failure of the test)"), message
    assert (tmp_path / "restores-failed").read_text() == "x"  # no second try was made
    assert sandbox.hibernate_archive.is_file()

    restore_sandbox(sandbox, Criu())
    assert screen_and_mark(sandbox, None)[1] == mark


def test_a_restore_whose_images_changed_under_it_is_not_tried_again(
    sandbox: RuncSandbox, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A snapshot deleted while a copy of it is restored (its pool's refill) takes the
    images away: a second try could only fail again, and the warning of one would say
    something had gone wrong where the delete just did its work."""
    mark = "kept through a restore whose images went"
    hibernated_with_mark(sandbox, mark)
    with caplog.at_level(logging.WARNING, logger="deskbox.runc"), \
            pytest.raises(SessionFailed) as raised:
        restore_sandbox(sandbox, failing_criu(tmp_path, times=2, take_an_image=True))
    assert "tried twice" not in raised.value.message, raised.value.message
    assert (tmp_path / "restores-failed").read_text() == "x"  # one try only
    assert not [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert Runc().state(sandbox.container_id) is None

    restore_sandbox(sandbox, Criu())  # the hibernation archive itself is whole
    assert screen_and_mark(sandbox, None)[1] == mark
