"""Issue 38, round three: untrusted text in reports, and configs, meshes, caches, plugins and checkpoint globs
refused by name (the audio faults: tests/test_faults_audio.py; the converter's: tests/test_faults_conversion.py;
launch.tpu's arguments: tests/test_launch.py)."""

import html
import re

import numpy as np
import pytest

from s2sjax import flips

HOSTILE_TEXTS = ["<script>alert(1)</script> **bold** | x", "[click](javascript:alert(1)) ![i](http://x/i.png)",
                 "<img src=x onerror=alert(1)>", "`code` ~~gone~~ $x^2$ \\*", "two\nlines\n\n# a heading",
                 "&lt;b&gt; &amp; <!-- hidden -->"]


def test_a_flips_markdown_shows_a_release_text_as_it_reads():
  """Rendered by a CommonMark reader with HTML and GFM tables on, each cell holds the release's text as plain
  text: no tag, link, image or emphasis comes out of it."""
  markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py renders the page as a reader would")
  texts = HOSTILE_TEXTS
  flip = flips.Flip("q<1>*", True, 1.0, -1.0, tuple(texts[1:]), 0, (1.0,) * 5, (2.0,) * 5)
  page = flips.markdown("T", ("t2t", "s2t"), [flip], {"q<1>*": texts[0]}, {"q<1>*": "a_b*.wav"})
  rendered = markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(page)
  cells = re.findall(r"<td>(.*?)</td>", rendered, re.S)
  assert len(cells) == 6
  assert html.unescape(cells[0]) == "q<1>*" and html.unescape(cells[5]) == "a_b*.wav"
  assert html.unescape(cells[1]) == texts[0]
  candidates = [html.unescape(c) for c in cells[2].split("<br>")]
  expected = [" ".join(t.splitlines()) for t in texts[1:]]
  assert [c.split(" ", 1)[1].rsplit(" (T→T", 1)[0] for c in candidates] == expected
  tags = set(re.findall(r"<(/?\w+)", rendered))
  assert tags <= {"h1", "/h1", "h2", "/h2", "p", "/p", "table", "/table", "thead", "/thead", "tbody", "/tbody",
                  "tr", "/tr", "th", "/th", "td", "/td", "br"}
