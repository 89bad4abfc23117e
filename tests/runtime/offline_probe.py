"""Run in a fresh interpreter: record every network-capable call while loading and generating (or running a CLI line).

An audit hook is installed before edgerun is imported, so imports are covered too.
Prints one JSON object: the events seen and the hub/HTTP modules that got imported.
"""

import json
import sys

EVENTS = []
WATCH = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto", "socket.sendmsg", "urllib.Request")


def hook(event, args):
    if event in WATCH:
        EVENTS.append([event, repr(args)[:200]])


sys.addaudithook(hook)

if sys.argv[1] == "--cli":  # any edgerun command line, e.g. run AUDIO_BUNDLE --input clip.wav
    import contextlib
    import io

    from runtime.cli import main  # noqa: E402

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(sys.argv[2:])
    text, chat = buf.getvalue(), str(code)
else:
    from runtime.llm import LLM  # noqa: E402

    with LLM.load(sys.argv[1], memory="1G", ctx=512, threads=2) as llm:
        text = llm.generate("Offline test:", llm.params(max_tokens=8, temperature=0.0)).text
        chat = llm.chat([{"role": "user", "content": "Say hi."}], llm.params(max_tokens=8)).finish().text

hubs = sorted(m for m in sys.modules if m.split(".")[0] in ("requests", "urllib3", "httpx", "huggingface_hub", "aiohttp"))
print(json.dumps({"events": EVENTS, "hub_modules": hubs, "text": text, "chat": chat}))
