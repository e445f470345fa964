"""`make screenshots` as root: the throwaway server's data directory must be searchable by
the sandbox user (`nobody`), or the server refuses to start ("the sandbox user 'nobody'
cannot reach ..."). Checked without a browser: `take` is replaced by a probe of the folder
it is given."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.browser import screenshots


def test_the_work_folder_is_searchable_by_the_sandbox_user(monkeypatch, tmp_path) -> None:
    seen: list[int] = []
    monkeypatch.setattr(screenshots.support, "chromium_available_for_scripts", lambda: None)
    monkeypatch.setattr(screenshots, "take", lambda out, work: seen.append(work.stat().st_mode))
    assert screenshots.main(["--out", str(tmp_path / "shots")]) == 0
    (mode,) = seen
    assert mode & stat.S_IXOTH, oct(mode)  # searchable by others
    assert not mode & stat.S_IROTH, oct(mode)  # not listable
    assert Path(tmp_path).exists()
