"""Redraw docs/img/explorer.png: the explorer on the default run, one item open.

    python jobs/sweep.py root=/tmp/shot && python jobs/explore.py run=/tmp/shot/runs/demo
    python docs/img/screenshot.py /tmp/shot/runs/demo/explorer [demo/c05-1]

Needs headless Chromium and chromedriver (Debian: apt-get install chromium chromium-driver) and
selenium (the test extra). The window is 1280 x 1000 (a page of about 1280 x 860 px, as the README shows).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "explorer.png"


def main(site: Path, item: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver_path is None:
        sys.exit("needs chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        driver.get((site / "index.html").as_uri())
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#list tbody tr[data-id="{item}"]'))
        driver.find_element(By.CSS_SELECTOR, f'#list tbody tr[data-id="{item}"]').click()
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#detail tr.question"))
        driver.save_screenshot(str(OUT))
    finally:
        driver.quit()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]).resolve(), sys.argv[2] if len(sys.argv) > 2 else "demo/c05-1")
