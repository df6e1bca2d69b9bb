#!/usr/bin/env bash
# `promtool check rules` and `promtool test rules` (the unit tests in
# deploy/prometheus/shmlink.rules.test.yml) on the plain rules.
#
#   scripts/deploy/promtool-rules.sh
set -euo pipefail
cd "$(dirname "$0")/../../deploy/prometheus"
promtool check rules shmlink.rules.yml && promtool test rules shmlink.rules.test.yml
