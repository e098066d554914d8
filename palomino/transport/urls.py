"""Service URLs as logs and messages may show them: never with their password."""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit, urlunsplit

_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]*@", re.I)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
        if not parts.password:
            return url
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:  # not quite a URL (a bad port, say): scrub any user:password@ textually
        return redact_text(url)


def redact_text(text: str) -> str:
    """Every scheme://user:password@ in free text (an exception's message, say) with the password masked."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


class RedactingFilter(logging.Filter):
    """Masks user:password@ in every record a handler emits (its message and any traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = redact_text(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            if redact_text(text) != text:  # the traceback names the URL: keep the type, drop the text
                record.exc_text, record.exc_info = redact_text(text), None
        return True
