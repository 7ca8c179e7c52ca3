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

# ensure_venv DIR REQUIREMENTS [PIP_OPTIONS...]: a virtual environment with the pinned
# requirements, recreated only when the requirements file changes (its hash is stamped inside).
ensure_venv() {
  local dir="$1" requirements="$2" wanted
  local pip_options=("${@:3}")
  wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"
  if [[ ! -f "$dir/.requirements.sha256" || "$(cat "$dir/.requirements.sha256")" != "$wanted" ]]; then
    echo "setup: creating $dir with $(grep -cvE '^\s*(#|$)' "$requirements") pinned packages"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install -q --upgrade pip
    "$dir/bin/python" -m pip install -q "${pip_options[@]}" -r "$requirements"
    echo "$wanted" > "$dir/.requirements.sha256"
  fi
}

venv="$repo_root/.venv"
ensure_venv "$venv" "$repo_root/tools/requirements.txt"
export PATH="$venv/bin:$PATH"

# Where libHalide and its autoscheduler plugins are, in the venv.
halide_library_dir() { python3 -c 'import halide, os; print(os.path.join(halide.install_dir(), "lib64"))'; }
