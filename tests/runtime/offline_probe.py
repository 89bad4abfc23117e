"""Run in a fresh interpreter: record every network-capable call while loading and generating (or running a CLI line).

An audit hook is installed before edgerun is imported, so imports are covered too.
Prints one JSON object: the events seen and the hub/HTTP modules that got imported.

What is watched (WATCH): outbound sockets (connect, sendto, sendmsg), name lookups
(getaddrinfo, gethostbyname[_ex], gethostbyaddr, getnameinfo), urllib requests, and
programs that reach the network started by subprocess, os.system, os.exec* or
os.posix_spawn (NETWORK_TOOLS). test_offline.py proves the hook records each one.
"""

import json
import os
import sys

EVENTS = []
WATCH = (
    "socket.connect", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
    "urllib.Request",
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
)
SPAWN = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn")
NETWORK_TOOLS = {"curl", "wget", "git", "ssh", "scp", "sftp", "rsync", "nc", "ncat", "netcat", "ftp", "telnet",
                 "pip", "pip3", "huggingface-cli", "hf", "nslookup", "dig", "host", "ping"}


def _program(event, args):
    """The base name of the program a spawn event starts; for ``sh -c "CMD"``, CMD's program."""
    cmd = args[0] if event == "os.system" else args[1]  # os.system(command); (executable|path, args|argv, ...)
    words = os.fsdecode(cmd).split() if isinstance(cmd, (str, bytes)) else [os.fsdecode(w) for w in cmd or ()]
    if not words:
        words = [os.fsdecode(args[0])]
    name = os.path.basename(words[0])
    if name in ("sh", "bash", "dash", "zsh") and "-c" in words[:-1]:
        return _program("os.system", (words[words.index("-c") + 1],))
    return name


def hook(event, args):
    if event not in WATCH:
        return
    if event in SPAWN and _program(event, args) not in NETWORK_TOOLS:
        return  # a local program (e.g. vcgencmd) is not a network call
    EVENTS.append([event, repr(args)[:200]])


def main(argv):
    sys.addaudithook(hook)
    if argv[0] == "--cli":  # any edgerun command line, e.g. run AUDIO_BUNDLE --input clip.wav
        import contextlib
        import io

        from apps.cli import main as cli

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = cli(argv[1:])
        text, chat = buf.getvalue(), str(code)
    else:
        from runtime.llm.model import LLM

        with LLM.load(argv[0], memory="1G", ctx=512, threads=2) as llm:
            text = llm.generate("Offline test:", llm.params(max_tokens=8, temperature=0.0)).text
            chat = llm.chat([{"role": "user", "content": "Say hi."}], llm.params(max_tokens=8)).finish().text

    hubs = sorted(m for m in sys.modules if m.split(".")[0] in ("requests", "urllib3", "httpx", "huggingface_hub", "aiohttp"))
    print(json.dumps({"events": EVENTS, "hub_modules": hubs, "text": text, "chat": chat}))


if __name__ == "__main__":
    main(sys.argv[1:])
