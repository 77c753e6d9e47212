#!/usr/bin/env bash
# podsnap's images as standard archives a user can ship, and pushed to the user's registry.
# podsnap publishes no images: these are the only way to get them onto a cluster.
#
#   hack/images.sh export [ARCHIVE]
#       one docker-archive per image (podsnap-operator, podsnap-agent, podsnap-demo) under
#       $PODSNAP_IMAGES_DIR (default out/images/), each tagged localhost/podsnap-NAME:$TAG, from ARCHIVE (default:
#       the multi-image archive hack/cluster/build-images.sh makes, localhost/podsnap-NAME:dev).
#       `docker load`, `podman load`, `ctr images import` and skopeo read them.
#   hack/images.sh push REGISTRY
#       copies each exported archive to docker://REGISTRY/podsnap-NAME:$TAG with skopeo, and prints the
#       helm values that install those images. Credentials: `skopeo login REGISTRY` (or
#       REGISTRY_AUTH_FILE). TLS is verified unless the registry is on localhost/127.0.0.1 or INSECURE=1.
#
# TAG defaults to `git describe --always --dirty` of the tree the images were built from.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/hack/lib.sh"
DIR=${PODSNAP_IMAGES_DIR:-$ROOT/out/images}
NAMES=(podsnap-operator podsnap-agent podsnap-demo)
SOURCE_TAG=${PODSNAP_SOURCE_TAG:-dev}   # hack/cluster/common.sh IMAGE_TAG
TAG=${TAG:-$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo dev)}

need_skopeo() {
  command -v skopeo >/dev/null || apt_install skopeo
  command -v skopeo >/dev/null || die "skopeo not found: apt-get install skopeo"
}

export_images() {
  local archive=${1:-}
  if [ -z "$archive" ]; then archive=$("$ROOT/hack/cluster/build-images.sh" | tail -1); fi
  [ -f "$archive" ] || die "no image archive at $archive (run: make images)"
  need_skopeo
  mkdir -p "$DIR"
  for name in "${NAMES[@]}"; do
    rm -f "$DIR/$name.tar"
    skopeo copy --quiet "docker-archive:$archive:localhost/$name:$SOURCE_TAG" "docker-archive:$DIR/$name.tar:localhost/$name:$TAG" \
      || die "skopeo could not copy localhost/$name:$SOURCE_TAG out of $archive"
  done
  echo "$TAG" >"$DIR/TAG"
  log "image archives (tag $TAG) in $DIR: $(cd "$DIR" && ls ./*.tar | tr '\n' ' ')"
}

push_images() {
  local registry=${1:-}
  [ -n "$registry" ] || die "usage: hack/images.sh push REGISTRY (e.g. make images-push REGISTRY=registry.example.com/podsnap)"
  [[ $registry =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9._-]+)*$ ]] \
    || die "REGISTRY=$registry is not a registry host with an optional port and path (e.g. registry.example.com:5000/ml)"
  [ -f "$DIR/TAG" ] || die "no image archives in $DIR (run: make images)"
  local tag host tls=()
  tag=$(cat "$DIR/TAG")
  host=${registry%%/*}
  case "${host%%:*}" in localhost | 127.0.0.1) tls=(--dest-tls-verify=false) ;; esac
  [ "${INSECURE:-0}" = 1 ] && tls=(--dest-tls-verify=false)
  need_skopeo
  for name in "${NAMES[@]}"; do
    [ -f "$DIR/$name.tar" ] || die "$DIR/$name.tar missing (run: make images)"
    skopeo copy --quiet "${tls[@]}" "docker-archive:$DIR/$name.tar" "docker://$registry/$name:$tag" \
      || die "skopeo could not push $name to $registry (log in with: skopeo login $host)"
    log "pushed $registry/$name:$tag"
  done
  echo "helm values for these images: --set image.registry=$registry --set image.tag=$tag"
}

case "${1:-}" in
  export) shift; export_images "$@" ;;
  push) shift; push_images "$@" ;;
  *) die "usage: hack/images.sh export [ARCHIVE] | push REGISTRY" ;;
esac
