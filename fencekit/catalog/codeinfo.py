"""Find code fencekit did not generate on a protected table, and hash it for the allow-list.

A statement on a protected table runs more than fencekit's checks: other triggers, column
defaults and generated columns, CHECK and exclusion constraints, index expressions and
predicates, row-level security policies, rules, the domains and types of its columns, and the
triggers of tables a foreign key cascades into. Any of them can call
``set_config('fencekit.token', ...)``, and a swapped token lets a stale write through (for the
rest of the transaction, once the setting is local). This module names each such object and
what code it runs; :mod:`fencekit.catalog` turns them into drift.

An expression counts as running code when it calls a function that is not built in (nor part of
an installed extension, nor fencekit's), a built-in that changes a setting or runs SQL text
(``set_config``, ``query_to_xml`` ...), an operator implemented by such a function, casts to a
domain whose CHECK does, or holds a subquery (which reaches views and their functions).
Expressions are read from their stored node trees, not their text, so no spelling hides a call.

Each object has a code hash: sha256 over what it runs, never its name. A trigger's hash covers
its function's language, body, arguments, result, security mode (and owner, when it runs as
its owner) and settings, the trigger's arguments and its WHEN clause; an expression's covers its
text and the hashes of the functions it calls. A DBA records a reviewed hash in
``fencekit.allowed_code`` (:mod:`.allowed`); a renamed trigger keeps its hash, a changed body
gets a new one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fencekit.catalog.model import Conn

__all__ = ["FIRST_NORMAL_OID", "Code", "Inspector", "code_hash"]


#: PostgreSQL's FirstNormalObjectId: objects below it were made by initdb (built in).
FIRST_NORMAL_OID = 16384

#: Built-in functions that change a setting or run SQL given as text: in a default, a
#: constraint, a policy or an index they can swap fencekit.token as a user function can.
RISKY_BUILTINS = (
    "set_config",
    "query_to_xml",
    "query_to_xmlschema",
    "query_to_xml_and_xmlschema",
    "cursor_to_xml",
    "cursor_to_xmlschema",
    "table_to_xml",
    "table_to_xmlschema",
    "table_to_xml_and_xmlschema",
    "schema_to_xml",
    "schema_to_xmlschema",
    "schema_to_xml_and_xmlschema",
    "database_to_xml",
    "database_to_xmlschema",
    "database_to_xml_and_xmlschema",
    "ts_stat",
    # run SQL given as text (ts_rewrite(tsquery, text)), or a type's input function and its
    # domain CHECKs named by a string (PostgreSQL 16+): the second review's N5
    "ts_rewrite",
    "pg_input_is_valid",
    "pg_input_error_info",
)

# References in a stored node tree (pg_node_tree's text form).
_FUNC_REF = re.compile(r":(?:funcid|aggfnoid|winfnoid|opfuncid) (\d+)")
_OP_REF = re.compile(r":opno (\d+)")
_OPS_REF = re.compile(r":opnos \(o ([\d ]+)\)")
_TYPE_REF = re.compile(r":(?:resulttype|consttype|funcresulttype|minmaxtype|typeId) (\d+)")
_WHEN = re.compile(r" WHEN \((.*)\) EXECUTE (?:FUNCTION|PROCEDURE) ", re.S)


def code_hash(fields: dict[str, Any]) -> str:
    """sha256 over ``fields`` as canonical JSON (sorted keys): what an object runs."""
    text = json.dumps(fields, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Code:
    """What one object runs that fencekit did not generate."""

    #: What runs, for people: "calls public.swap_token()", "holds a subquery", ...
    reasons: tuple[str, ...]
    #: Code hashes of the user functions called (part of the object's own hash).
    hashes: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.reasons)


@dataclass
class _Function:
    name: str  # schema.name(args)
    user: bool  # not built in, not an extension's, not fencekit's
    risky: bool  # a built-in in RISKY_BUILTINS
    sha256: str
    system: bool = False  # built in or an installed extension's: PostgreSQL's C code


@dataclass
class Inspector:
    """Reads pg_catalog for one status run; caches what it learnt about functions and types."""

    conn: Conn
    _functions: dict[int, _Function] = field(default_factory=dict)
    _types: dict[int, Code] = field(default_factory=dict)
    #: Functions the per-kind checks looked at since :meth:`start_table`: the catalog walk
    #: reports what they did not (:func:`fencekit.catalog.code.unknown_code_drift`).
    looked_at: set[int] = field(default_factory=set)

    def start_table(self) -> None:
        self.looked_at = set()

    # ------------------------------------------------------------------ functions

    def functions(self, oids: Iterable[int]) -> list[_Function]:
        oids = [o for o in oids if o]
        self.looked_at.update(oids)
        wanted = sorted(set(oids) - self._functions.keys())
        if wanted:
            rows = self.conn.execute(
                """SELECT p.oid, pg_catalog.format('%%I.%%I(%%s)', n.nspname, p.proname,
                                               pg_catalog.pg_get_function_identity_arguments(p.oid)),
                          p.oid >= %s AND n.nspname <> 'fencekit' AND NOT (EXISTS (
                            SELECT FROM pg_catalog.pg_depend d
                             WHERE d.classid OPERATOR(pg_catalog.=)
                                   'pg_catalog.pg_proc'::pg_catalog.regclass
                               AND d.objid = p.oid AND d.deptype = 'e') AND o.rolsuper),
                          n.nspname = 'pg_catalog' AND p.proname = ANY(%s),
                          p.oid < %s OR (EXISTS (
                            SELECT FROM pg_catalog.pg_depend d
                             WHERE d.classid OPERATOR(pg_catalog.=)
                                   'pg_catalog.pg_proc'::pg_catalog.regclass
                               AND d.objid = p.oid AND d.deptype = 'e') AND o.rolsuper),
                          l.lanname, p.prosrc, p.probin, p.prosecdef,
                          CASE WHEN p.prosqlbody IS NOT NULL
                               THEN pg_catalog.pg_get_function_sqlbody(p.oid) END,
                          CASE WHEN p.prosecdef THEN p.proowner::pg_catalog.regrole::pg_catalog.text
                          END,
                          p.proconfig, pg_catalog.pg_get_function_arguments(p.oid),
                          pg_catalog.pg_get_function_result(p.oid)
                     FROM pg_catalog.pg_proc p
                     JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                     JOIN pg_catalog.pg_language l ON l.oid = p.prolang
                     -- an extension's member is PostgreSQL's own code only when a superuser
                     -- owns it: an owner can ALTER EXTENSION ... ADD its own function
                     JOIN pg_catalog.pg_roles o ON o.oid = p.proowner
                    WHERE p.oid = ANY(%s)""",
                (FIRST_NORMAL_OID, list(RISKY_BUILTINS), FIRST_NORMAL_OID, wanted),
            ).fetchall()
            for (
                oid,
                name,
                user,
                risky,
                system,
                lang,
                src,
                binary,
                secdef,
                atomic,
                owner,
                config,
                args,
                res,
            ) in rows:
                self._functions[int(oid)] = _Function(
                    str(name),
                    bool(user),
                    bool(risky),
                    code_hash(
                        {
                            "language": lang,
                            "source": src,
                            "binary": binary,
                            # a BEGIN ATOMIC body is in prosqlbody, not prosrc ('')
                            "atomic_body": atomic,
                            "security_definer": secdef,
                            "owner": owner,
                            "config": list(config or []),
                            "arguments": args,
                            "result": res,
                        }
                    ),
                    bool(system) and not risky,
                )
        return [self._functions[o] for o in sorted(set(oids)) if o in self._functions]

    def function(self, oid: int) -> _Function | None:
        found = self.functions([oid])
        return found[0] if found else None

    def system_function(self, oid: int) -> bool:
        """Built in or an installed extension's (``suppress_redundant_updates_trigger``,
        ``tsvector_update_trigger``, ``moddatetime``): C code of the server's own install, which
        sets no setting."""
        f = self.function(oid)
        return f is not None and f.system

    def function_hash(self, oid: int) -> str:
        f = self.function(oid)
        return f.sha256 if f is not None else code_hash({"missing_function": oid})

    # ------------------------------------------------------------------ expressions

    def expression(self, tree: str | None) -> Code:
        """What a stored expression (pg_node_tree as text) runs."""
        if not tree:
            return Code(())
        reasons: list[str] = []
        hashes: list[str] = []
        funcs = {int(m) for m in _FUNC_REF.findall(tree)}
        ops = {int(m) for m in _OP_REF.findall(tree)}
        for group in _OPS_REF.findall(tree):
            ops.update(int(o) for o in group.split())
        ops.discard(0)
        if ops:
            for opname, opcode, user_op in self.conn.execute(
                "SELECT o.oid::pg_catalog.regoperator::pg_catalog.text, o.oprcode::pg_catalog.oid,"
                " o.oid >= %s FROM pg_catalog.pg_operator o WHERE o.oid = ANY(%s)",
                (FIRST_NORMAL_OID, sorted(ops)),
            ).fetchall():
                impl = self.function(int(opcode))
                if impl is not None and (impl.user or impl.risky):
                    reasons.append(f"operator {opname} (function {impl.name})")
                    hashes.append(impl.sha256)
                elif user_op and impl is None:
                    reasons.append(f"operator {opname}")
                funcs.discard(int(opcode))
        for f in self.functions(funcs):
            if f.user:
                reasons.append(f"calls {f.name}")
                hashes.append(f.sha256)
            elif f.risky:
                reasons.append(f"calls {f.name}, which changes settings or runs SQL text")
        for typ in sorted({int(t) for t in _TYPE_REF.findall(tree)}):
            code = self.type_code(typ)
            reasons += code.reasons
            hashes += code.hashes
        if "{SUBLINK" in tree:
            reasons.append("holds a subquery (which can reach views and the functions they call)")
        return Code(tuple(dict.fromkeys(reasons)), tuple(sorted(set(hashes))))

    # ------------------------------------------------------------------ types

    def type_code(self, oid: int) -> Code:
        """What a value of type ``oid`` runs when it is made: the CHECKs of a domain (and of
        the domains it is built on), the input functions of a user-defined base type, the same
        for array elements, range subtypes and composite types' columns."""
        if oid < FIRST_NORMAL_OID:
            return Code(())
        if oid in self._types:
            return self._types[oid]
        self._types[oid] = Code(())  # a recursive type ends here
        row = self.conn.execute(
            "SELECT t.oid::pg_catalog.regtype::pg_catalog.text, t.typtype::pg_catalog.text, "
            "t.typbasetype, t.typelem, t.typrelid, t.typinput, "
            "(SELECT r.rngsubtype FROM pg_catalog.pg_range r WHERE r.rngtypid = t.oid), "
            "t.typdefaultbin::pg_catalog.text, "
            "ARRAY(SELECT r.rngsubdiff::pg_catalog.oid FROM pg_catalog.pg_range r "
            "       WHERE r.rngtypid = t.oid "
            "      UNION ALL SELECT r.rngcanonical::pg_catalog.oid FROM pg_catalog.pg_range r "
            "       WHERE r.rngtypid = t.oid), "
            "(SELECT r.rngtypid FROM pg_catalog.pg_range r WHERE r.rngmultitypid = t.oid) "
            "FROM pg_catalog.pg_type t WHERE t.oid = %s",
            (oid,),
        ).fetchone()
        if row is None:
            return Code(())
        name, typtype, base, elem, relid, typinput, subtype, default, range_procs, range_of = row
        reasons: list[str] = []
        hashes: list[str] = []

        def add(code: Code, prefix: str) -> None:
            reasons.extend(f"{prefix}{r}" for r in code.reasons)
            hashes.extend(code.hashes)

        if typtype == "d":
            checks = self.conn.execute(
                "SELECT conname, conbin::pg_catalog.text, pg_catalog.pg_get_constraintdef(oid) "
                "FROM pg_catalog.pg_constraint WHERE contypid = %s AND contype = 'c' "
                "ORDER BY conname",
                (oid,),
            ).fetchall()
            for cname, tree, _ in checks:
                add(self.expression(tree), f"domain {name} CHECK {cname} ")
            add(self.expression(default), f"domain {name} DEFAULT ")
            add(self.type_code(int(base)), "")
            # The whole definition is pinned: a CHECK added to an allowed domain (even one
            # of built-ins only) or a changed DEFAULT changes the hash.
            hashes.append(
                code_hash({"domain": name, "checks": [c[2] for c in checks], "default": default})
            )
        elif typtype == "m" and range_of:
            add(self.type_code(int(range_of)), "")
        elif typtype == "b" and elem:
            add(self.type_code(int(elem)), "")
        elif typtype == "b":
            f = self.function(int(typinput))
            if f is not None and f.user:
                reasons.append(f"type {name} reads its values with {f.name}")
                hashes.append(f.sha256)
        elif typtype == "r" and subtype:
            add(self.type_code(int(subtype)), "")
            # subtype_diff runs in GiST penalties, selectivity and ANALYZE; canonical on input
            for f in self.functions([int(p) for p in range_procs or []]):
                if f.user:
                    reasons.append(f"range {name} runs {f.name}")
                    hashes.append(f.sha256)
        elif typtype == "c" and relid:
            for (att,) in self.conn.execute(
                "SELECT atttypid FROM pg_catalog.pg_attribute WHERE attrelid = %s AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum",
                (relid,),
            ).fetchall():
                add(self.type_code(int(att)), "")
        code = Code(tuple(dict.fromkeys(reasons)), tuple(sorted(set(hashes))))
        self._types[oid] = code
        return code

    # ------------------------------------------------------------------ triggers

    def trigger_hash(
        self, function_oid: int, args: bytes | None, definition: str, when_tree: str | None
    ) -> str:
        """A trigger's code hash: its function's, its arguments and its WHEN clause with the
        functions that calls (not its name, its table or its timing)."""
        when = _WHEN.search(definition)
        return code_hash(
            {
                "function": self.function_hash(function_oid),
                "arguments": (args or b"").decode("utf-8", "replace"),
                "when": when.group(1) if when else None,
                "when_calls": list(self.expression(when_tree).hashes),
            }
        )
