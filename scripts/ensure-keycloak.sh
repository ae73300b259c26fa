#!/usr/bin/env bash
# Puts Keycloak, the authorization server of the upstream-identity tests
# (docs/upstream-auth.md), in target/keycloak/keycloak-$VERSION: the
# org.keycloak:keycloak-quarkus-dist zip from Maven Central, pinned by
# version and checked against the sha256 below before it is unpacked.
# Downloaded once (with progress); later runs find it. Keycloak 26.7 runs
# on Java 21 or newer: prints the JAVA_HOME the tests will use, or says
# what is missing.
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
  echo "ensure-keycloak: Keycloak $VERSION needs Java 21 or newer; none found (JAVA_HOME, /usr/lib/jvm). Install one (apt-get install openjdk-21-jdk-headless, or Temurin) and run again" >&2
  exit 1
fi
echo "$java" > "$dir/java-home"
echo "keycloak $VERSION ($home), java $("$java/bin/java" -version 2>&1 | head -1 | cut -d'"' -f2) ($java)" >&2
