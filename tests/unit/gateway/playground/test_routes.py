"""The playground's routes on a bare FastAPI app: the page at / and /playground, its modules with a
JavaScript type (browsers refuse module scripts otherwise), no path escapes the static folder, and
every file the page references exists and is declared as package data (so an install serves it)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.playground import routes

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    routes.register(app)
    return TestClient(app)


@pytest.mark.parametrize("path", ["/", "/playground"])
def test_the_page_is_served_at_root_and_playground(client, path):
    reply = client.get(path)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/playground/static/app.js">' in reply.text


@pytest.mark.parametrize(
    "name",
    [
        "app.js",
        "audio.js",
        "realtime.js",
        "media.js",
        "turn-metrics.js",
        "call-card.js",
        "player-worklet.js",
        "mic-worklet.js",
    ],
)
def test_modules_are_served_as_javascript(client, name):
    reply = client.get(f"{routes.STATIC_PREFIX}/{name}")
    assert reply.status_code == 200
    assert "javascript" in reply.headers["content-type"]


def test_stylesheet_is_css_and_unknown_files_are_404(client):
    assert client.get(f"{routes.STATIC_PREFIX}/style.css").headers["content-type"].startswith("text/css")
    assert client.get(f"{routes.STATIC_PREFIX}/nope.js").status_code == 404
    assert client.get(f"{routes.STATIC_PREFIX}/../routes.py").status_code == 404


def test_every_referenced_file_exists():
    """index.html's links and the modules' relative imports and worklet names all resolve."""
    html = (routes.STATIC_DIR / "index.html").read_text()
    names = re.findall(r'(?:src|href)="/playground/static/([^"]+)"', html)
    for module in routes.STATIC_DIR.glob("*.js"):
        text = module.read_text()
        names += re.findall(r'from "\./([^"]+)"', text)
        names += re.findall(r'new URL\("([^"]+\.js)"', text)
    assert {"app.js", "style.css", "player-worklet.js", "mic-worklet.js"} <= set(names)
    for name in names:
        assert (routes.STATIC_DIR / name).is_file(), name


def test_static_files_are_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["gateway.playground"]
    shipped = {p.name for pattern in patterns for p in routes.STATIC_DIR.parent.glob(pattern)}
    assert shipped == {p.name for p in routes.STATIC_DIR.iterdir() if p.is_file()}
