"""What every Kubernetes manifest tensorpilot writes needs: one set of rules for the names,
image references and resource quantities a user gives (``deploy k8s`` and ``launch k8s``), and
the rendering of manifest dicts as YAML.

The API server checks names only when a manifest is applied, and an image reference only fails
when a node pulls it; checking here refuses a bad value before any file is written, in one
sentence that says which rule. Values are checked, never escaped: every user string reaches a
manifest as one string value, and ``to_yaml`` (yaml.safe_dump) quotes it as needed.

A bottom-layer module: standard library at import (``yaml`` is imported where a manifest is
rendered), no tensorpilot import but the errors.
"""

from __future__ import annotations

import re
from typing import Any

from tensorpilot.errors import ConfigError

# Object names, https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
# (validation.IsDNS1123Label / IsDNS1035Label / IsDNS1123Subdomain in k8s.io/apimachinery).
# RFC 1123 label: namespaces, and any name that becomes a DNS label.
DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
# RFC 1035 label: a Service's name (it becomes a DNS name that may not start with a digit), and
# names the Kubeflow training operator turns into Service names.
DNS1035_LABEL = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
# DNS subdomain: most object names (Deployments, PersistentVolumeClaims, StorageClasses). The
# Kubernetes rule is the 253-character bound and this pattern; unlike DNS proper it sets no
# 63-character bound on each part, so neither do we.
DNS1123_SUBDOMAIN = re.compile(rf"{DNS1123_LABEL.pattern}(?:\.{DNS1123_LABEL.pattern})*")
LABEL_MAX = 63
SUBDOMAIN_MAX = 253

# Image reference: Kubernetes passes it to the container runtime, which parses it with the
# grammar of github.com/distribution/reference (regexp.go, reference.go), written here in ASCII
# classes (Go's \w is ASCII, Python's is not); https://kubernetes.io/docs/concepts/containers/images/
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_IMAGE_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
IMAGE_REFERENCE = re.compile(rf"(?P<name>{_IMAGE_NAME})(?::{_TAG})?(?:@{_DIGEST})?")
IMAGE_NAME_MAX = 255                 # reference.NameTotalLengthMax: registry and path together
_IMAGE_MAX = 4096                    # any longer is a mistake; bounds the regex's work too

# Resource quantity, https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/
# (k8s.io/apimachinery/pkg/api/resource/quantity.go): a decimal number and a binary (Ki..Ei),
# decimal (k..E) or exponent suffix. Positive only, and without milli ('m'): every quantity a
# user gives here is a size in bytes, where "1m" is a typo for a megabyte, not a thousandth.
QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|[eE][+-]?[0-9]{1,2})?")
_QUANTITY_MAX = 64


def shown(value: Any, limit: int = 80) -> str:
    """A value as an error message quotes it: repr, so a newline shows as \\n, and a string cut at
    ``limit`` characters, so a hostile megabyte does not become the message."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + "..."
    return repr(value)


def is_dns1123_label(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= LABEL_MAX and DNS1123_LABEL.fullmatch(value) is not None


def is_dns1035_label(value: Any, max_length: int = LABEL_MAX) -> bool:
    """``max_length``: lower than 63 where the name is a prefix of a longer label."""
    return isinstance(value, str) and len(value) <= max_length and DNS1035_LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: Any) -> bool:
    return (isinstance(value, str) and len(value) <= SUBDOMAIN_MAX
            and DNS1123_SUBDOMAIN.fullmatch(value) is not None)


def check_dns_label(what: str, value: str) -> str:
    """An RFC 1123 label (a namespace); returns ``value`` or raises ConfigError."""
    if not is_dns1123_label(value):
        raise ConfigError(f"{what} {shown(value)} must be a DNS-1123 label: a DNS label of at most 63 characters "
                          "(lowercase letters, digits and '-'), starting and ending with a letter or digit.")
    return value


def check_dns1035_label(what: str, value: str) -> str:
    """An RFC 1035 label (a Service name); returns ``value`` or raises ConfigError."""
    if not is_dns1035_label(value):
        raise ConfigError(f"{what} {shown(value)} must be a DNS-1035 label: a DNS label of at most 63 characters "
                          "(lowercase letters, digits and '-'), starting with a lowercase letter and ending "
                          "with a letter or digit.")
    return value


def check_dns_subdomain(what: str, value: str) -> str:
    """A DNS subdomain (most object names); returns ``value`` or raises ConfigError."""
    if not is_dns1123_subdomain(value):
        raise ConfigError(f"{what} {shown(value)} must be a DNS-1123 subdomain: a DNS subdomain of at most 253 "
                          "characters, labels of lowercase letters, digits and '-' joined by '.', each "
                          "starting and ending with a letter or digit.")
    return value


def check_image(image: str, what: str = "--image") -> str:
    """A container image reference; returns ``image`` or raises ConfigError."""
    m = (IMAGE_REFERENCE.fullmatch(image)
         if isinstance(image, str) and len(image) <= _IMAGE_MAX else None)
    if m is None or len(m.group("name")) > IMAGE_NAME_MAX:
        raise ConfigError(f"{what} {shown(image)} must be an image reference, "
                          "[registry[:port]/]name[:tag][@digest] with a lowercase name and no spaces, "
                          "e.g. ghcr.io/org/tensorpilot:1.0.")
    return image


def check_quantity(what: str, value: str) -> str:
    """A positive resource quantity in bytes (e.g. a volume size); returns ``value`` or raises
    ConfigError."""
    m = QUANTITY.fullmatch(value) if isinstance(value, str) and len(value) <= _QUANTITY_MAX else None
    if m is None or float(m.group(1)) <= 0:
        raise ConfigError(f"{what} {shown(value)} must be a positive Kubernetes quantity, e.g. 100Gi, 500G or 2Ti.")
    return value


def to_yaml(*docs: dict[str, Any]) -> str:
    """Manifests as YAML text: one document each, joined by '---', keys in the order written
    (apiVersion, kind, metadata, spec read as in the Kubernetes docs). safe_dump emits plain
    data only and quotes any string that YAML would otherwise read as another type."""
    import yaml

    return yaml.safe_dump_all(docs, sort_keys=False)


__all__ = ["DNS1123_LABEL", "DNS1035_LABEL", "DNS1123_SUBDOMAIN", "IMAGE_REFERENCE", "QUANTITY", "shown",
           "is_dns1123_label", "is_dns1035_label", "is_dns1123_subdomain", "check_dns_label",
           "check_dns1035_label", "check_dns_subdomain", "check_image", "check_quantity", "to_yaml"]
