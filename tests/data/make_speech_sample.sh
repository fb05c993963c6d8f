#!/usr/bin/env bash
# Made tests/data/speech_16k.wav once, on Debian 12 with espeak-ng 1.51 and SoX 14.4.2
# (apt-get install -y espeak-ng sox). The tests read the committed file: nothing here runs at
# test time, and neither program is needed to run the tests. Rerun only to replace the sample;
# with sox -D (no dither) the output is byte-for-byte the same on the same versions. The
# voice-activity tests expect a few seconds of 16 kHz mono 16-bit PCM speech that silero-vad
# scores as speech (mean probability > 0.5).
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp --suffix=.wav)
trap 'rm -f "$tmp"' EXIT
espeak-ng -v en-us -s 150 -w "$tmp" "The quick brown fox jumps over the lazy dog, twice."
sox -D "$tmp" -r 16000 -c 1 -b 16 -e signed-integer speech_16k.wav
