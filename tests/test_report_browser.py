"""The tiny study's HTML report opened in headless Chromium: no script error, every category and every
result figure listed, and a figure that opens and is not blank."""

from __future__ import annotations

import hashlib
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from workflow_run import REPO, TINY, snakemake

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH: install Debian's chromium (.ci/install-chromium)"),
]


#: categories whose rules the tiny study does not run: its plans have k=1, and only plans with k >= 2 run as
#: pipelines (tests/test_pipeline_workflow.py checks that category in its own study's report)
NOT_IN_TINY = {"Pipeline"}


def declared_categories() -> set[str]:
    """Every report category named by a rule (workflow/rules/*.smk)."""
    text = "".join(path.read_text() for path in (REPO / "workflow" / "rules").glob("*.smk"))
    return set(re.findall(r'(?<!sub)category="([^"{}]+)"', text))


def variance(path: Path) -> float:
    return float(np.asarray(Image.open(path).convert("L"), dtype=float).std())


@pytest.fixture(scope="module")
def report(tiny_study) -> Path:
    for name in ("report.html", "report.zip"):
        out = snakemake(tiny_study, TINY, "--report", name)
        assert out.returncode == 0, out.stderr[-4000:]
    return tiny_study


def test_report_zip_holds_every_figure(report):
    with zipfile.ZipFile(report / "report.zip") as archive:
        assert "report/report.html" in archive.namelist()
        held = {hashlib.sha256(archive.read(name)).hexdigest() for name in archive.namelist()}
    figures = list((report / "results" / "plots").rglob("*.png"))
    assert figures
    for png in figures:  # the zip keeps each figure as a file (under a hashed folder): same bytes
        assert hashlib.sha256(png.read_bytes()).hexdigest() in held, png


def test_report_in_headless_chromium(report, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    errors: list[str] = []
    with sync_api.sync_playwright() as play:
        browser = play.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
        page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
        home = (report / "report.html").as_uri()
        page.goto(home)
        page.get_by_text("Statistics", exact=True).wait_for()  # the app has rendered its menu
        categories = page.evaluate("categories")  # the report's own index: category -> subcategory -> files
        results = page.evaluate("Object.keys(results)")

        # every category a rule declares is in the report, and every figure the study drew is a result
        assert declared_categories() - NOT_IN_TINY <= set(categories)
        figures = {str(p.relative_to(report)) for p in (report / "results" / "plots").rglob("*.png")}
        assert figures and figures <= set(results)

        # the sidebar lists each category; each subcategory's table lists each of its results (a category
        # with a single subcategory opens its table at once)
        listed = 0
        for category, subcategories in categories.items():
            page.goto(home)
            page.get_by_role("link", name=category, exact=True).click()
            for subcategory, files in subcategories.items():
                if len(subcategories) > 1:
                    page.get_by_role("link", name=subcategory, exact=True).click()
                rows = page.locator("table tbody tr")
                rows.first.wait_for()
                # a label with two values, each on half the results (e.g. the fusion target), is a toggle:
                # each row then stands for two results
                per_row = 2 if page.locator("fieldset").count() else 1
                assert rows.count() * per_row == len(files), (category, subcategory)
                listed += rows.count() * per_row
                if len(subcategories) > 1:
                    page.get_by_role("link", name=category, exact=True).click()  # back, by the breadcrumb
        assert listed == len(results)

        # a figure opens: the before/after memory figure of the first planned model
        page.goto(home)
        page.get_by_role("link", name="Memory plan", exact=True).click()
        if len(categories["Memory plan"]) > 1:
            page.get_by_role("link", name="tiny_gpt2", exact=True).click()
        page.locator('a[iconname="eye"]').first.click()
        figure = page.locator('img[src^="data:image/png"]')
        figure.wait_for()
        assert page.evaluate("img => img.naturalWidth", figure.element_handle()) > 400
        shot = tmp_path / "figure.png"
        figure.screenshot(path=str(shot))
        page.screenshot(path=str(tmp_path / "page.png"))
        browser.close()
    assert not errors, errors
    assert variance(shot) > 20, "the figure's screenshot is blank"
