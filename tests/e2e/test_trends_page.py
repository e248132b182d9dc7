"""`history --changes` writes changes.html; a real headless Chromium opens it from the file system: no script error,
no console error, every changed key's trend drawn and the filters working. Skipped, with the reason, without
Chromium (Debian: apt-get install chromium; .ci/run installs it)."""

import re
import shutil
import subprocess

import pytest

from harness.cli.main import main
from tests.unit.history.test_index import KEYS, write_history

pytestmark = pytest.mark.e2e

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _open(page, tmp_path, script: str = "") -> tuple[str, str]:
    """The DOM after the page loaded (and after `script`, run in it), and what the browser said on stderr."""
    if script:  # appended to the copy opened, as a user's click would be: filters set, then applied
        text = page.read_text().replace("</body>", f"<script>{script}</script></body>")
        page = tmp_path / "opened.html"
        page.write_text(text)
    res = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--no-first-run", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout, res.stderr


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_the_trends_page_opens_in_a_browser_and_shows_every_changed_key(tmp_path, capsys):
    root = write_history(tmp_path / "results")
    assert main(["history", str(root), "--changes"]) == 0
    page = root / "history" / "changes.html"
    assert str(page) in capsys.readouterr().out
    dom, said = _open(page, tmp_path)
    assert not re.search(r"CONSOLE.*(error|Uncaught)", said, re.I), said[-2000:]
    assert "data-errors" not in dom
    changed = 2 * len(KEYS)  # the planted step, on both testbeds
    assert f'data-ready="{changed} trends"' in dom
    assert dom.count("<polyline") == changed and dom.count('stroke="#c00"') == changed  # one change point each
    dom, said = _open(page, tmp_path, "document.querySelector('select[data-field=testbed_id]').value = 'tb-a';"
                                      "document.querySelector('select[data-field=phase]').value = 'fwd';"
                                      "applyFilters();")
    assert re.search(r'<span id="shown">2</span>', dom), dom[:500]  # tb-a's two fwd keys
    assert "data-errors" not in dom
