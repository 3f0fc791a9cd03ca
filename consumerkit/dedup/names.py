"""Namespaces and handler names as small keys: one ``integer`` in each dedup row instead of
the text, looked up in ``{schema}.consumerkit_names``.

The claim function registers a name the first time it writes a row for it, in the claiming
transaction (``consumerkit_name_key``). Two transactions registering the same new name wait
for each other once; names are registered in sorted order, so two batches never deadlock on
them. A name registered by a transaction that rolls back is simply registered again later.
"""

from __future__ import annotations

from .._identifiers import identifier, qualified

TABLE = "consumerkit_names"
FUNCTION = "consumerkit_name_key"


def names_ddl(schema: str) -> list[str]:
    """The name table and the function returning (and on first use creating) a name's key."""
    identifier(schema, "schema name")
    table = qualified(schema, TABLE)
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
            id serial PRIMARY KEY,
            name text NOT NULL UNIQUE
        )""",
        f"""CREATE OR REPLACE FUNCTION {qualified(schema, FUNCTION)}(p_name text)
        RETURNS integer LANGUAGE plpgsql VOLATILE AS $fn$
        DECLARE
            v_id integer;
        BEGIN
            SELECT n.id INTO v_id FROM {table} AS n WHERE n.name = p_name;
            IF v_id IS NULL THEN
                -- waits for a concurrent transaction registering the same name; its outcome
                -- is then visible to the next statement (a fresh snapshot)
                INSERT INTO {table} AS n (name) VALUES (p_name)
                ON CONFLICT (name) DO NOTHING RETURNING n.id INTO v_id;
            END IF;
            IF v_id IS NULL THEN
                SELECT n.id INTO v_id FROM {table} AS n WHERE n.name = p_name;
            END IF;
            RETURN v_id;
        END $fn$""",
        f"REVOKE ALL ON FUNCTION {qualified(schema, FUNCTION)}(text) FROM PUBLIC",
    ]
