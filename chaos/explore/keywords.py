"""Rows of a sweep by name, as pytest's `-k` picks tests (`torchchaos battery -k`)."""

from __future__ import annotations

import re
from collections.abc import Callable

from torchchaos.errors import UsageError

PLACE = "?"  # what the reference run places, in a row outlined before it ran (battery)

Truth = bool | None  # None: not known before the reference run places the row


class Keywords:
    """pytest's `-k` over row names: words, each a substring of the name in any case,
    joined with `and`, `or`, `not` and parentheses (`kill and not node`); an empty
    expression selects every row. A row outlined before the reference run (`?` where a
    number goes) may or may not be selected by a word with a digit in it: None."""

    WORD = re.compile(r"(?:\w|[:+\-.\[\]\\/])+")

    def __init__(self, text: str) -> None:
        self.text = text
        self._tokens = self._tokenize(text)
        self._at = 0
        if self._tokens[0][0] == "end":
            self._tree: Callable[[Callable[[str], Truth]], Truth] = lambda _match: True
        else:
            self._tree = self._or()
        if self._peek()[0] != "end":
            self._fail("'and', 'or' or the end")

    def selects(self, name: str) -> Truth:
        lowered = name.lower()

        def match(word: str) -> Truth:
            if word.lower() in lowered:
                return True
            if PLACE in name and any(c.isdigit() for c in word):
                return None  # the number may be one the reference run places
            return False

        return self._tree(match)

    # the grammar, as pytest's: or := and ('or' and)*; and := not ('and' not)*;
    # not := 'not' not | '(' or ')' | word

    def _tokenize(self, text: str) -> list[tuple[str, str, int]]:
        tokens, at = [], 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at == len(text):
                tokens.append(("end", "", at))
                return tokens
            if text[at] in "()":
                tokens.append((text[at], text[at], at))
                at += 1
                continue
            found = self.WORD.match(text, at)
            if found is None:
                raise UsageError(f"-k {text!r}: unexpected {text[at]!r} at column {at + 1}")
            word = found.group()
            tokens.append((word if word in ("and", "or", "not") else "word", word, at))
            at = found.end()

    def _peek(self) -> tuple[str, str, int]:
        return self._tokens[self._at]

    def _take(self) -> tuple[str, str, int]:
        token = self._tokens[self._at]
        self._at += 1
        return token

    def _fail(self, expected: str) -> None:
        kind, word, at = self._peek()
        got = "the end" if kind == "end" else repr(word)
        raise UsageError(f"-k {self.text!r}: expected {expected} at column {at + 1},"
                         f" got {got}")

    def _or(self) -> Callable[[Callable[[str], Truth]], Truth]:
        parts = [self._and()]
        while self._peek()[0] == "or":
            self._take()
            parts.append(self._and())
        return parts[0] if len(parts) == 1 else lambda match: _any([p(match) for p in parts])

    def _and(self) -> Callable[[Callable[[str], Truth]], Truth]:
        parts = [self._not()]
        while self._peek()[0] == "and":
            self._take()
            parts.append(self._not())
        return parts[0] if len(parts) == 1 else lambda match: _all([p(match) for p in parts])

    def _not(self) -> Callable[[Callable[[str], Truth]], Truth]:
        kind, word, _at = self._peek()
        if kind == "not":
            self._take()
            inner = self._not()
            return lambda match: _negate(inner(match))
        if kind == "(":
            self._take()
            inner = self._or()
            if self._peek()[0] != ")":
                self._fail("')'")
            self._take()
            return inner
        if kind == "word":
            self._take()
            return lambda match: match(word)
        self._fail("a word, 'not' or '('")
        raise AssertionError  # _fail raised


def _any(values: list[Truth]) -> Truth:
    return True if True in values else (None if None in values else False)


def _all(values: list[Truth]) -> Truth:
    return False if False in values else (None if None in values else True)


def _negate(value: Truth) -> Truth:
    return None if value is None else not value
