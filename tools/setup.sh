#!/usr/bin/env bash
# Installs what the project needs and is missing: Debian packages (tools/apt-packages.txt)
# and a project-local virtual environment .venv with the pinned PyPI toolchain
# (tools/requirements.txt). Safe to run again: each step is skipped when already done.
# Meant to be sourced by tools/main.sh and tools/test.sh; exports PATH with .venv/bin first.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

missing_apt=()
while read -r package _; do
  [[ -z "$package" || "$package" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing_apt+=("$package")
done < "$repo_root/tools/apt-packages.txt"
if ((${#missing_apt[@]})); then
  echo "setup: installing Debian packages: ${missing_apt[*]}"
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing_apt[@]}"
fi

venv="$repo_root/.venv"
stamp="$venv/.requirements.sha256"
wanted="$(sha256sum "$repo_root/tools/requirements.txt" | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
  echo "setup: creating $venv with $(grep -cvE '^\s*(#|$)' "$repo_root/tools/requirements.txt") pinned packages"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$repo_root/tools/requirements.txt"
  echo "$wanted" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
