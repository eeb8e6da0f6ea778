#!/usr/bin/env bash
# Builds the serve_app image from docker/Dockerfile and tags it with pyproject.toml's version:
# the image k8s/rayservice.yaml names (tests/deploy/test_image.py checks they agree).
#   scripts/build_image.sh              build ghcr.io/serve-app/serve-app:VERSION
#   scripts/build_image.sh --push       build, then push it
#   scripts/build_image.sh --print-tag  print the image reference only (no Docker needed)
# SERVE_APP_IMAGE names another repository (then point k8s/rayservice.template.yaml at it).
# Needs Docker with BuildKit (the default builder), and about 30 GB of disk for the layers.
set -euo pipefail
cd "$(dirname "$0")/.."
repository=${SERVE_APP_IMAGE:-ghcr.io/serve-app/serve-app}
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image="$repository:$version"
case "${1:-}" in
  --print-tag) echo "$image"; exit 0 ;;
  --push | "") ;;
  *) echo "usage: $0 [--push | --print-tag]" >&2; exit 2 ;;
esac
docker build --file docker/Dockerfile --tag "$image" .
if [ "${1:-}" = --push ]; then
  docker push "$image"
fi
echo "$image"
