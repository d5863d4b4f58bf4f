"""The test page at / in headless Chromium: choose fixtures/jfk.wav, see its transcript; press
Start microphone with Chromium's fake microphone playing jfk.wav, see its sentence appear.

Chromium is Debian's `chromium` (.ci/run installs it); it is driven over the Chrome DevTools
Protocol with Tornado's own WebSocket client, so the test needs no driver and no extra Python
package. The file goes in through DOM.setFileInputFiles, which fires the input's change event
as a user's choice would; the page then POSTs it to /inference and writes the transcript. A
screenshot of the result is saved as page.png in the test's tmp dir. The microphone is Chromium's
fake capture device reading a WAV file (`--use-file-for-fake-audio-capture`); the page sends it
through its AudioWorklet over the WebSocket as a person's microphone would be (mic.png).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest
from server_process import JFK, JFK_WORDS, Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", "--window-size=900,720", "--remote-debugging-port=0"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")


class DevTools:
    """The smallest CDP client: send a command, wait for its answer, ignore events."""

    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    async def __call__(self, method, **params):
        self.next_id += 1
        await self.ws.write_message(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            raw = await self.ws.read_message()
            if raw is None:
                raise RuntimeError(f"Chromium closed the DevTools connection during {method}")
            msg = json.loads(raw)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def js(self, expression):
        r = await self("Runtime.evaluate", expression=expression, returnByValue=True)
        return r["result"].get("value")

    async def until(self, expression, timeout):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            value = await self.js(expression)
            if value:
                return value
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{expression} stayed false for {timeout} s")


def _devtools_port(profile, proc, timeout=30):
    path = os.path.join(profile, "DevToolsActivePort")
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().split()
            if lines:
                return int(lines[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        time.sleep(0.1)
    raise TimeoutError("chromium did not open its DevTools port")


@contextlib.contextmanager
def page(tmp_path, url, *flags):
    """Headless Chromium on `url`: yields a coroutine function run(steps) that gives
    steps(cdp) a DevTools client on the page once it shows the model, and closes it after."""
    profile = tmp_path / "chromium-profile"
    browser = subprocess.Popen([CHROMIUM, *FLAGS, *flags, f"--user-data-dir={profile}", url],
                               stdout=subprocess.DEVNULL, stderr=open(tmp_path / "chromium.log", "w"))

    async def run(steps):
        from tornado.websocket import websocket_connect

        port = _devtools_port(str(profile), browser)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        ws = await websocket_connect(pages[0]["webSocketDebuggerUrl"], max_message_size=64 << 20)
        cdp = DevTools(ws)
        try:
            await cdp.until("document.readyState === 'complete' && "
                            "document.getElementById('model').textContent.includes('tiny.en')", 30)
            return await steps(cdp)
        finally:
            ws.close()

    try:
        yield run
    finally:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()


async def screenshot(cdp, path):
    shot = await cdp("Page.captureScreenshot", format="png")
    with open(path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))


def text_of(element_id):
    return f"document.getElementById('{element_id}').textContent"


def test_page_uploads_a_clip_and_shows_its_transcript(tmp_path):
    async def steps(cdp):
        root = (await cdp("DOM.getDocument"))["root"]["nodeId"]
        node = (await cdp("DOM.querySelector", nodeId=root, selector="#file"))["nodeId"]
        await cdp("DOM.setFileInputFiles", files=[JFK], nodeId=node)
        await cdp.until("document.getElementById('transcript').dataset.done === '1'", 120)
        text, status = await cdp.js(text_of("transcript")), await cdp.js(text_of("status"))
        await cdp.until(text_of("model") + ".includes('1 requests')", 10)
        await screenshot(cdp, tmp_path / "page.png")
        return text, status

    server = Server(str(tmp_path), "page", "tiny.en").wait()
    try:
        with page(tmp_path, server.url + "/") as run:
            text, status = asyncio.run(run(steps))
    finally:
        server.stop()
    assert JFK_WORDS in text, (text, status)
    assert status.startswith("jfk.wav: ") and status.endswith(" ms")
    assert (tmp_path / "page.png").stat().st_size > 10_000
    assert "200 POST /inference" in server.output()


MIC_FLAGS = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             "--autoplay-policy=no-user-gesture-required"]


def test_page_microphone_streams_and_shows_the_sentence(tmp_path):
    import numpy as np
    import soundfile as sf

    from nwhisper.io.audio import load_audio, resample

    x = load_audio(JFK)
    mic = np.concatenate([np.zeros(16000, np.float32), x, np.zeros(3 * 16000, np.float32)])
    wav = tmp_path / "mic.wav"
    sf.write(wav, resample(mic, 16000, 48000), 48000, subtype="PCM_16")

    async def steps(cdp):
        await cdp.js("document.getElementById('mic').click()")
        await cdp.until(text_of("utterances") + ".includes('for your country')", 120)   # the last words
        await cdp.until(text_of("room") + ".includes('pause')", 10)
        said, room, status = [await cdp.js(text_of(e)) for e in ("utterances", "room", "status")]
        await screenshot(cdp, tmp_path / "mic.png")
        return said, room, status

    server = Server(str(tmp_path), "mic", "tiny.en").wait()
    try:
        with page(tmp_path, server.url + "/", *MIC_FLAGS, f"--use-file-for-fake-audio-capture={wav}") as run:
            said, room, status = asyncio.run(run(steps))
    finally:
        server.stop()
    said = said.lower()                  # the utterances as the endpointer cut them, one line each
    assert all(w in said for w in ("fellow", "country can do for you", "for your country")), (said, status)
    assert status.startswith("listening: silero VAD") and status.endswith("00 Hz"), status  # the
    # AudioContext's own rate (44100 or 48000, the output device's), resampled by the server
    assert "noise" in room and "pause" in room
    assert (tmp_path / "mic.png").stat().st_size > 10_000
