"""``edgerun wyoming``: speech-to-text, text-to-speech and wake-word detection for Home Assistant over Wyoming
(see apps/voice/wyoming_server.py), every model resident under one memory plan."""

from __future__ import annotations

import argparse
import asyncio
import sys

from apps.cli.flags import integer, number, size, thread_count

HELP = "serve speech-to-text, text-to-speech and wake words to Home Assistant over Wyoming (tcp://127.0.0.1:10300)"
NON_COMMERCIAL = ("note: openWakeWord's models are CC BY-NC-SA 4.0 (non-commercial use only); a wake word of your own "
                  "converted with `edgerun convert audio` carries its own license")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--uri", default="tcp://127.0.0.1:10300",
                        help="where to listen: tcp://HOST:PORT, unix://PATH or stdio:// (default tcp://127.0.0.1:10300)")
    parser.add_argument("--allow-lan", action="store_true",
                        help="allow a --uri beyond this machine (Wyoming has no authentication: trusted networks only)")
    parser.add_argument("--asr", default="default", metavar="REF",
                        help="speech-to-text model: an asr recipe or a CTranslate2 Whisper folder (default whisper-tiny-en)")
    parser.add_argument("--tts", default="default", metavar="REF",
                        help="text-to-speech voice: a tts recipe or a Piper voice folder (default piper-joe-medium)")
    parser.add_argument("--wake-word", metavar="REF",
                        help="wake-word detector: an audio bundle (installed name or folder) from `edgerun convert audio "
                             "zoo:openwakeword-alexa ...` (default: no wake-word service)")
    parser.add_argument("--no-asr", action="store_true", help="do not offer speech-to-text")
    parser.add_argument("--no-tts", action="store_true", help="do not offer text-to-speech")
    parser.add_argument("--memory", type=size(), metavar="SIZE", help="one memory budget for every served model, e.g. 1G")
    parser.add_argument("--threads", type=thread_count, metavar="N", help="CPU threads per model (default: the placement's)")
    # the server's bounds (apps/voice/wyoming_server.py): what one client, or many, can hold
    parser.add_argument("--max-connections", type=integer(1, 1024), default=16, metavar="N",
                        help="connections at once; one more gets an error event and is closed (default 16)")
    parser.add_argument("--max-audio-seconds", type=number(1, 600, "at 16 kHz, 19 MB per connection at most"), default=60.0,
                        metavar="S", help="audio in one transcribe request; longer is refused with an error event (default 60)")
    parser.add_argument("--idle-timeout", type=number(1, 86400), default=300.0, metavar="S",
                        help="close a connection that sends nothing, or half an event, for this long (default 300)")


def build_service(args: argparse.Namespace):
    """The residency manager with the served models added (planned, pinned: a Wyoming service keeps them loaded),
    and the service over it. Nothing is loaded yet."""
    from apps.voice.wyoming_server import Served, WyomingService
    from runtime.errors import BadInput
    from runtime.llm.plan import default_budget
    from runtime.residency.manager import ModelSpec, ResidencyManager

    models = ResidencyManager(args.memory or default_budget())
    options = {"threads": args.threads} if args.threads else {}
    served: dict[str, Served] = {}
    try:
        for kind, ref, off in (("asr", args.asr, args.no_asr), ("tts", args.tts, args.no_tts)):
            if not off:
                models.add(ModelSpec(kind, ref, kind, pinned=True, keep_alive_s=None, options=options))
                served[kind] = _speech_served(kind, ref)
        if args.wake_word:
            models.add(ModelSpec("wake", args.wake_word, "audio", pinned=True, keep_alive_s=None, options=options))
            served["wake"] = _wake_served(args.wake_word)
        if not served:
            raise BadInput("--no-asr and --no-tts without --wake-word leave nothing to serve")
        return WyomingService(models, **served, max_connections=args.max_connections,
                              max_transcribe_seconds=args.max_audio_seconds, idle_seconds=args.idle_timeout)
    except BaseException:
        models.close()
        raise


def _speech_served(kind: str, ref: str):
    from wyoming.info import Attribution

    from apps.voice.wyoming_server import EDGERUN, Served
    from runtime.speech.models import DEFAULTS, find_recipe

    recipe = find_recipe(DEFAULTS[kind] if ref == "default" else ref, kind)
    if recipe is None:  # a folder: named after it
        return Served(kind, public=ref.rstrip("/").rsplit("/", 1)[-1] or kind, attribution=EDGERUN)
    return Served(kind, public=recipe.name, description=f"{recipe.description} (license {recipe.license})",
                  attribution=Attribution(name=recipe.package, url=recipe.homepage or f"https://pypi.org/project/{recipe.package}"))


def _wake_served(ref: str):
    from apps.voice.wyoming_server import EDGERUN, Served
    from runtime.bundle.resolve import resolve
    from runtime.classify.classifier import read_labels

    model = resolve(ref)
    manifest = model.manifest
    labels = read_labels(model, manifest.audio.labels if manifest.audio else None)
    phrase = labels[0] if labels else manifest.name
    return Served("wake", public=phrase, phrase=phrase, attribution=EDGERUN,
                  description=f"{manifest.ref}: wake word {phrase!r} (license {manifest.license})")


def main(args: argparse.Namespace) -> int:
    from apps.voice.wyoming_server import check_uri, serve

    uri = check_uri(args.uri, args.allow_lan, warn=lambda line: print(f"edgerun: {line}", file=sys.stderr))
    service = build_service(args)
    try:
        if service.wake is not None:
            print(f"edgerun: {NON_COMMERCIAL}", file=sys.stderr)
        service.preload()  # every model loaded before the port opens: Home Assistant's first request does not wait
        offered = ", ".join(f"{kind} {s.shown}" for kind, s in (("asr", service.asr), ("tts", service.tts),
                                                                ("wake", service.wake)) if s is not None)
        from runtime.units import fmt_bytes

        stats = service.models.stats()
        print(f"edgerun: serving Wyoming on {uri} ({offered}; {fmt_bytes(stats['used_bytes'])} planned of a "
              f"{fmt_bytes(stats['budget_bytes'])} budget); add it in Home Assistant as a Wyoming Protocol integration",
              file=sys.stderr)
        asyncio.run(serve(service, uri))
    finally:
        service.close()
        service.models.close()
    print("edgerun: Wyoming server stopped", file=sys.stderr)
    return 0
