"""Namespaces and handler names as small keys: one ``bigint`` in each dedup row instead of the
text.

A name's key is a 64-bit hash of it (``hashtextextended(name, seed)``), so a claim computes it
without reading a table and without waiting for anyone: a key looked up in a table of its own,
made unique there, would make every lane of a new consumer wait for the first transaction that
registered the name, for as long as that transaction runs. ``{schema}.consumerkit_names`` maps
keys back to names, for people and the ``{table}_ids`` views. The claim adds a name the first
time it stores a row for it, with a plain insert (no unique index to wait on; two transactions
registering one name at once leave two equal entries, which the views read as one).

Two names with one key would share their ids. The chance is about ``n² / 2⁶⁵`` for ``n``
names (10⁻¹² for 10,000), and registering a name whose key another name already has fails
loudly, so a collision can only pass unnoticed if both names are used for the first time in
two transactions running at the same moment.
"""

from __future__ import annotations

from ..shared.identifiers import identifier, qualified

TABLE = "consumerkit_names"
FUNCTION = "consumerkit_name_key"
SEED = 0x6E616D65
"""Seed ("name") of ``hashtextextended`` for name keys, apart from the lock keys' seed."""


def key_sql(name: str) -> str:
    """The SQL expression of the key of the text expression ``name``."""
    return f"hashtextextended({name}, {SEED})"


def names_ddl(schema: str) -> list[str]:
    """The name table and the function returning a name's key, registering it if new."""
    identifier(schema, "schema name")
    table = qualified(schema, TABLE)
    function = qualified(schema, FUNCTION)
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
            id bigint NOT NULL,
            name text NOT NULL
        )""",
        f"CREATE INDEX IF NOT EXISTS {identifier(TABLE + '_id_idx')} ON {table} (id)",
        f"""CREATE OR REPLACE FUNCTION {function}(p_name text)
        RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$
        DECLARE
            v_id bigint := {key_sql('p_name')};
            v_known boolean;
            v_other text;
        BEGIN
            -- one statement, so one snapshot: with two, a transaction registering the same
            -- name could commit between them, and its entry read as another name's
            SELECT bool_or(n.name = p_name), min(n.name) FILTER (WHERE n.name <> p_name)
              INTO v_known, v_other FROM {table} AS n WHERE n.id = v_id;
            IF v_known THEN
                RETURN v_id;
            END IF;
            IF v_other IS NOT NULL THEN
                RAISE EXCEPTION 'consumerkit: the name % has the key of another name, %',
                    p_name, v_other
                    USING ERRCODE = 'unique_violation',
                          HINT = 'rename the consumer or the handler';
            END IF;
            INSERT INTO {table} (id, name) VALUES (v_id, p_name);
            RETURN v_id;
        END $fn$""",
        f"REVOKE ALL ON FUNCTION {function}(text) FROM PUBLIC",
    ]
