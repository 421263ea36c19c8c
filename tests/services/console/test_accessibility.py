"""Accessibility basics on every page of the console: each form control has a label,
each image an alt text, one h1 per page, and the skip link moves the focus to the main
content. (The keyboard-only flow is in test_topics_page.py.)"""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests._cluster import Cluster
from tests.services.console.conftest import ConsoleProcess

TOPIC = "T_console_a11y"
PAGES = (
    "/cluster",
    "/topics",
    "/topics/new",
    f"/topics/{TOPIC}",
    f"/topics/{TOPIC}/delete",
    "/groups",
    f"/groups/G_console_a11y?topic={TOPIC}",
    "/login",
    "/no-such-page",
)
# Controls without a label: [id, name, type] of each (empty when all are labelled).
UNLABELLED_JS = """() => Array.from(document.querySelectorAll('input, select, textarea'))
  .filter(el => el.type !== 'hidden')
  .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                && !el.getAttribute('aria-labelledby'))
  .map(el => [el.id, el.name, el.type])"""
# A label's for= finds the first element of an id: ids must be unique.
DUPLICATE_IDS_JS = """() => {
  const ids = Array.from(document.querySelectorAll('[id]'), el => el.id);
  return ids.filter((id, i) => ids.indexOf(id) !== i); }"""
NO_ALT_JS = """() => Array.from(document.querySelectorAll('img, input[type=image]'))
  .filter(el => !el.hasAttribute('alt')).map(el => el.outerHTML.slice(0, 120))"""


def test_every_page_has_labels_alt_texts_and_one_h1(
    page: Page, console: ConsoleProcess, console_cluster: Cluster
) -> None:
    console_cluster.create_topic(TOPIC, queues=1)
    for path in PAGES:
        page.goto(f"{console.url}{path}")
        assert page.evaluate(UNLABELLED_JS) == [], path
        assert page.evaluate(NO_ALT_JS) == [], path
        assert page.evaluate(DUPLICATE_IDS_JS) == [], path
        expect(page.locator("h1")).to_have_count(1)
        assert page.get_attribute("html", "lang") == "en", path
        expect(page.get_by_role("main")).to_have_count(1)
        expect(page.get_by_role("navigation", name="Main")).to_have_count(1)


def test_the_skip_link_is_first_and_moves_the_focus_to_the_content(
    page: Page, console: ConsoleProcess
) -> None:
    page.goto(f"{console.url}/topics")
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    expect(skip).to_be_visible()  # shown when focused
    page.keyboard.press("Enter")
    expect(page.locator("#main")).to_be_focused()
    # The next Tab goes into the content, past the menu.
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Create a topic")).to_be_focused()
