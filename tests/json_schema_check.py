# tests/json_schema.sh: the JSON-schema recognizer (src/json_schema.c, src/json_prefix.c)
# through tests/json_schema_driver, against Python's jsonschema.
#   - random instances of each schema, dumped compact, spaced and indented: taken whole, and
#     their cuts are prefixes;
#   - one-byte edits of them: a text the recognizer takes whole parses and validates (what
#     tpinfer writes under a schema is valid under it);
#   - hand-made texts each schema must refuse, and schemas tpinfer must refuse by name.
import json, random, re, subprocess, sys, tempfile, os
import jsonschema

DRIVER = sys.argv[1]
rng = random.Random(7)

ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
           "required": ["city", "zip"], "additionalProperties": False}
PYDANTIC = '{"$defs": {"Address": {"properties": {"city": {"maxLength": 40, "minLength": 1, "title": "City", "type": "string"}, "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Zip"}}, "required": ["city"], "title": "Address", "type": "object"}, "Cat": {"properties": {"pet_type": {"const": "cat", "title": "Pet Type", "type": "string"}, "meows": {"maximum": 10, "minimum": 0, "title": "Meows", "type": "integer"}}, "required": ["pet_type", "meows"], "title": "Cat", "type": "object"}, "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"}, "Dog": {"properties": {"pet_type": {"const": "dog", "title": "Pet Type", "type": "string"}, "barks": {"exclusiveMaximum": 100, "exclusiveMinimum": 0, "title": "Barks", "type": "number"}}, "required": ["pet_type", "barks"], "title": "Dog", "type": "object"}}, "properties": {"name": {"title": "Name", "type": "string"}, "age": {"maximum": 150, "minimum": 0, "title": "Age", "type": "integer"}, "color": {"$ref": "#/$defs/Color"}, "tags": {"items": {"type": "string"}, "maxItems": 3, "title": "Tags", "type": "array"}, "scores": {"additionalProperties": {"type": "number"}, "title": "Scores", "type": "object"}, "address": {"$ref": "#/$defs/Address"}, "others": {"default": [], "items": {"$ref": "#/$defs/Address"}, "title": "Others", "type": "array"}, "pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}, "propertyName": "pet_type"}, "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Pet"}, "point": {"maxItems": 2, "minItems": 2, "prefixItems": [{"type": "integer"}, {"type": "integer"}], "title": "Point", "type": "array"}, "born": {"format": "date", "title": "Born", "type": "string"}, "id": {"format": "uuid", "title": "Id", "type": "string"}, "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Nick"}, "kind": {"default": "a", "enum": ["a", "b"], "title": "Kind", "type": "string"}}, "required": ["name", "age", "color", "tags", "scores", "address", "pet", "point", "born", "id"], "title": "Person", "type": "object"}'

# patterns (JSON Schema's: a match anywhere unless anchored) and strings each matches
PATTERNS = {
    "^[A-Z]{3}-\\d{2,3}$": ["ABC-12", "XYZ-999"],
    "ab+c": ["abc", "xxabbbcyy", "\u00e9abc\n"],
    "^[^@\\s]+@[^@\\s]+\\.[a-z]{2,}$": ["a@b.cd", "\u00e9t\u00e9@x.org"],
    "^(?:foo|bar)(baz)?$": ["foo", "barbaz"],
    "^\\w+( \\w+)*$": ["one", "two words", "a b c_9"],
    "^.\\.?[\\u00e0-\\u00ff]*$": ["x", "\U0001F600.\u00e9\u00e0", "\\"],
    "^\\d{4}-(0[1-9]|1[0-2])-\\d\\d$": ["2024-01-31", "1999-12-00"],
    "^[a-f0-9]{8}(-[a-f0-9]{4}){3}-[a-f0-9]{12}$": ["0123abcd-0000-ffff-1234-0123456789ab"],
    "^(?:x|)$": ["", "x"],
    "^\\\"\\/\\t[\\]\\-]+?$": ["\"/\t]", "\"/\t-]-"],
}

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                       "score": {"type": "number"}, "ok": {"type": "boolean"}},
     "required": ["name", "age", "score", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {
        "id": {"type": "integer", "description": "the id"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "address": ADDRESS,
        "color": {"enum": ["red", "green", "blue \u2713"]},
        "level": {"enum": [1, 2, 10, -3.5, True, None]},
        "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "when": {"type": ["string", "null"], "format": "date-time"},
        "kind": {"const": "person"}},
     "required": ["id", "tags", "address", "color", "level", "nick", "when", "kind"]},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                        "required": ["v", "kids"]}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                                       "any": {}, "list": {"type": "array"}}},
    {"type": "array", "items": {"type": "number"}, "minItems": 2},
    {"enum": ["a", "ab", "abc"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "string"}, "b": {"type": "boolean"},
                                       "c": {"type": "null"}, "d": {"type": "integer"}},
     "required": ["b", "d"]},
    # anyOf whose branches begin alike: objects told apart by a const, numbers, strings
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                "required": ["kind", "r"]},
               {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "number"},
                                                 "h": {"type": "number"}}, "required": ["kind", "w", "h"]},
               {"type": "integer"}, {"type": "number"}, {"enum": ["circle", "x"]}, {"type": "string"}]},
    # vLLM's tool_choice "required": calls of the tools, each its name and its parameters
    {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": ["get_weather"]},
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                       "required": ["city"], "additionalProperties": False}},
         "required": ["name", "parameters"]},
        {"properties": {"name": {"type": "string", "enum": ["get_time"]},
                        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                       "required": ["tz"], "additionalProperties": False}},
         "required": ["name", "parameters"]}]}},
    # oneOf told apart by a const, allOf of a $ref, a $ref beside keywords, keywords beside anyOf,
    # an enum beside a type
    {"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
     "type": "object", "properties": {
        "item": {"oneOf": [
            {"allOf": [{"$ref": "#/$defs/base"},
                       {"properties": {"t": {"const": "a"}, "x": {"type": "string"}}, "required": ["t", "x"]}]},
            {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"t": {"const": "b"}}, "required": ["t"]}]}]},
        "pick": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                 "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
        "more": {"$ref": "#/$defs/base", "properties": {"z": {"type": "boolean"}}, "required": ["z"]},
        "word": {"type": "string", "enum": ["a", 1, "b", None]}},
     "required": ["item", "pick", "more", "word"]},
    # string lengths (code points) and number bounds, inclusive and exclusive, one-sided
    {"type": "object", "properties": {
        "code": {"type": "string", "minLength": 2, "maxLength": 4},
        "name": {"type": "string", "minLength": 3},
        "note": {"type": ["string", "null"], "maxLength": 5},
        "age": {"type": "integer", "minimum": 18, "maximum": 130},
        "delta": {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10},
        "p": {"type": "number", "minimum": 0, "maximum": 1},
        "t": {"type": "number", "exclusiveMinimum": -5, "maximum": -2},
        "big": {"type": "integer", "minimum": 1000},
        "neg": {"type": "integer", "maximum": -7},
        "half": {"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3.5},
        "lvl": {"enum": ["a", "abc", "abcdef", 3, 30], "minLength": 2, "maximum": 10}},
     "required": ["code", "name", "note", "age", "delta", "p", "t", "big", "neg", "half", "lvl"]},
    # tuples: prefixItems, then items (or none)
    {"type": "object", "properties": {
        "pt": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "items": False, "minItems": 2},
        "row": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"enum": ["x", "y"]}],
                "items": {"type": "integer"}},
        "opt": {"prefixItems": [{"type": "integer"}], "items": {"type": "string"}, "maxItems": 3}},
     "required": ["pt", "row", "opt"]},
    # pydantic 2.13's model_json_schema() of a model with nested models, an enum class, a
    # discriminated union, Optional, conint, constr, a tuple, dict, date and UUID fields
    json.loads(PYDANTIC),
    # patterns on strings, and an enum kept to its values that match
    {"type": "object", "properties": dict(
        [("p%d" % k, {"type": "string", "pattern": pat}) for k, pat in enumerate(PATTERNS)] +
        [("e", {"enum": ["x1", "y2", "zz", 7], "pattern": "\\d"})]),
     "required": ["p%d" % k for k in range(len(PATTERNS))] + ["e"]},
    # draft 4's exclusive bounds: booleans beside minimum and maximum
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array", "items": {"type": "integer", "minimum": 5,
     "exclusiveMinimum": True, "maximum": 9, "exclusiveMaximum": True}},
    # draft 7's tuple: items as a list, additionalItems
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
     "items": [{"type": "boolean"}, {"type": "null"}, {"enum": [1, 2]}], "additionalItems": False, "minItems": 1},
]

def merge(a, b):
    """allOf's meaning for the keywords these schemas merge (tpinfer's order: a's properties first)"""
    r = dict(a)
    for k, v in b.items():
        if k == "properties": r[k] = {**a.get(k, {}), **v}
        elif k == "required": r[k] = a.get(k, []) + [x for x in v if x not in a.get(k, [])]
        else: r[k] = v
    return r

def flat(s, root):
    """s with $ref beside keywords and allOf merged, keywords beside anyOf/oneOf put in each branch"""
    if "$ref" in s:
        s = merge(flat(root["$defs"][s["$ref"].split("/")[-1]], root), {k: v for k, v in s.items() if k != "$ref"})
    if "allOf" in s:
        r = {k: v for k, v in s.items() if k != "allOf"}
        for part in s["allOf"]:
            r = merge(r, flat(part, root))
        s = r
    for u in ("anyOf", "oneOf"):
        if u in s and len(s) > 1:
            rest = {k: v for k, v in s.items() if k != u}
            s = {u: [merge(rest, flat(b, root)) for b in s[u]]}
    return s

def gen(s, root, depth=0):
    if s is True: s = {}
    s = flat(s, root)
    if "$ref" in s:
        name = s["$ref"].split("/")[-1]
        return gen(root["$defs"][name], root, depth + 1)
    if "enum" in s:
        return rng.choice([v for v in s["enum"] if jsonschema.validators.validator_for(root)(s).is_valid(v)])
    if "const" in s: return s["const"]
    if "anyOf" in s: return gen(rng.choice(s["anyOf"]), root, depth)
    if "oneOf" in s: return gen(rng.choice(s["oneOf"]), root, depth)
    t = s.get("type")
    if isinstance(t, list): t = rng.choice(t)
    if t is None and ("properties" in s or "required" in s): t = "object"
    if t is None and "prefixItems" in s: t = "array"
    if t is None: return rng.choice([1, "x", None, [1, {"a": True}], {"k": [2.5]}])
    if t == "string":
        if "pattern" in s: return rng.choice(PATTERNS[s["pattern"]])
        if "minLength" in s or "maxLength" in s: # characters of every kind: escapes, accents, astral
            lo, hi = s.get("minLength", 0), s.get("maxLength", s.get("minLength", 0) + 6)
            return "".join(rng.choice("ab\"\\\n\u00e9\u65e5\U0001F600") for _ in range(rng.randint(lo, hi)))
        return rng.choice(["", "Ana", "caf\u00e9 \"q\" \\ /", "\u65e5\u672c", "line\nbreak", "emoji \U0001F600"])
    bounds = [s.get(k) for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")]
    bounds = [None if isinstance(b, bool) else b for b in bounds] # draft 4's flags: the draws are validated
    if t in ("integer", "number") and any(b is not None for b in bounds):
        lo = max([b for b in bounds[:2] if b is not None] or [-10**6])
        hi = min([b for b in bounds[2:] if b is not None] or [10**6])
        while True: # the bounds themselves often, where they are in
            x = rng.choice([lo, hi, rng.uniform(lo, hi)])
            x = int(round(x)) if t == "integer" or rng.random() < 0.3 else round(x, 3)
            if jsonschema.validators.validator_for(root)(s).is_valid(x): return x
    if t == "integer": return rng.choice([0, 7, -12, 123456789])
    if t == "number": return rng.choice([0, 1.5, -2.25e-3, 1e20, 42])
    if t == "boolean": return rng.choice([True, False])
    if t == "null": return None
    if t == "array":
        tuple_ = isinstance(s.get("items"), list)
        pre = s["items"] if tuple_ else s.get("prefixItems", [])
        rest = s.get("additionalItems", {}) if tuple_ else s.get("items", {})
        lo, hi = s.get("minItems", 0), s.get("maxItems", len(pre) + 4)
        if rest is False: hi = min(hi, len(pre))
        n = rng.randint(lo, max(lo, min(hi, len(pre) + 4 if depth < 3 else lo)))
        return [gen(pre[k] if k < len(pre) else rest, root, depth + 1) for k in range(n)]
    if t == "object":
        props = s.get("properties")
        if props: # the properties in order, a required one always, another or not
            req = set(s.get("required", []))
            return {k: gen(v, root, depth + 1) for k, v in props.items() if k in req or rng.random() < 0.6}
        add = s.get("additionalProperties", {})
        return {"k%d" % i: gen(add if isinstance(add, dict) else {}, root, depth + 1) for i in range(rng.randint(0, 3))}
    raise ValueError(t)

def dumps(v, ascii_ok):
    """ascii_ok: \\u escapes may spell non-ASCII characters (not where the schema's enum values
    or keys hold them: those are matched as the schema spells them, in UTF-8)"""
    style = rng.randrange(4)
    esc = ascii_ok and rng.random() < 0.5
    if style == 0: return json.dumps(v, separators=(",", ":"), ensure_ascii=esc)
    if style == 1: return json.dumps(v, ensure_ascii=esc)
    return json.dumps(v, indent=2 if style == 2 else "\t", ensure_ascii=False)

def run(schema, texts):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(schema, f)
    try:
        p = subprocess.run([DRIVER, f.name], input="".join(json.dumps(t) + "\n" for t in texts),
                           capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return p.returncode, p.stdout.splitlines(), p.stderr

def valid(schema, text):
    try:
        v = json.loads(text)
    except ValueError:
        return False
    try:
        jsonschema.validate(v, schema)
        return True
    except jsonschema.ValidationError:
        return False

fails = []
for si, schema in enumerate(SCHEMAS):
    ascii_ok = all(ord(ch) < 128 for ch in json.dumps(schema, ensure_ascii=False))
    texts = [dumps(gen(schema, schema), ascii_ok) for _ in range(150)]
    rc, out, err = run(schema, texts)
    assert rc == 0, (si, rc, out, err)
    for t, o in zip(texts, out):
        assert valid(schema, t), (si, t)
        if o != "whole": fails.append((si, "a valid instance not taken whole", t, o))
    cuts = [t[:rng.randrange(1, len(t))] for t in texts if len(t) > 1]
    rc, out, _ = run(schema, cuts)
    for t, o in zip(cuts, out):
        if o not in ("prefix", "whole"): fails.append((si, "a cut of a valid instance refused", t, o))
    edits = []
    for t in texts:
        for _ in range(20):
            at, kind = rng.randrange(len(t) + 1), rng.randrange(3)
            b = rng.choice('{}[]:," \n0123456789-.eEtrufalsn\\u/xabc')
            edits.append(t[:at] + (b if kind != 1 else "") + t[at + (kind != 0):])
    rc, out, _ = run(schema, edits)
    n_whole = 0
    for t, o in zip(edits, out):
        if o == "whole":
            n_whole += 1
            if not valid(schema, t): fails.append((si, "an edited text taken whole is not valid", t, o))
    print("schema %d: %d instances whole, %d edits of which %d taken whole (all valid)" % (si, len(texts), len(edits), n_whole))

PYD_OK = ('{"name": "A", "age": 30, "color": "red", "tags": [], "scores": {}, "address": {"city": "Oslo"}, '
          '"pet": {"pet_type": "cat", "meows": 3}, "point": [1, 2], "born": "2020-01-01", "id": "x"}')
BASE10 = ('{"code": "ab", "name": "Ana", "note": null, "age": 18, "delta": -9, "p": 0.5, "t": -2.5, "big": 1000, '
          '"neg": -7, "half": 1, "lvl": "abc"}')
assert valid(SCHEMAS[10], BASE10) and valid(SCHEMAS[12], PYD_OK)
# texts each schema must refuse (the byte where, or at the end: not whole)
REFUSE = [
    (0, '{"age": 3, "name": "a", "score": 1, "ok": true}'),   # out of order
    (0, '{"name": "a", "age": 3, "score": 1}'),               # a property missing
    (0, '{"name": "a", "age": 3, "score": 1, "ok": true, "x": 1}'),  # one more
    (0, '{"name": "a", "age": 3.5, "score": 1, "ok": true}'), # an integer with a fraction
    (0, '{"name": "a", "age": 1e3, "score": 1, "ok": true}'),
    (0, '{"name": 5, "age": 3, "score": 1, "ok": true}'),     # a wrong type
    (0, '{"name": "a", "age": 3, "score": "1", "ok": true}'),
    (0, '[1]'),
    (1, '{"id": 1, "tags": [], "address": {"city": "c", "zip": "z"}, "color": "red", "level": 1, "nick": null, "when": null, "kind": "person"}'),
    (1, '{"id": 1, "tags": ["a","b","c","d"], "address": {"city": "c", "zip": "z"}, "color": "red", "level": 1, "nick": null, "when": null, "kind": "person"}'),
    (1, '{"id": 1, "tags": ["a"], "address": {"city": "c", "zip": "z"}, "color": "reds", "level": 1, "nick": null, "when": null, "kind": "person"}'),
    (1, '{"id": 1, "tags": ["a"], "address": {"city": "c", "zip": "z"}, "color": "red", "level": 3, "nick": null, "when": null, "kind": "person"}'),
    (1, '{"id": 1, "tags": ["a"], "address": {"city": "c", "zip": "z"}, "color": "red", "level": 10.0, "nick": null, "when": null, "kind": "person"}'),
    (1, '{"id": 1, "tags": ["a"], "address": {"city": "c", "zip": "z"}, "color": "red", "level": 1, "nick": 5, "when": null, "kind": "person"}'),
    (1, '{"id": 1, "tags": ["a"], "address": {"city": "c", "zip": "z"}, "color": "red", "level": 1, "nick": null, "when": null, "kind": "robot"}'),
    (2, '{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": []}, {"v": 4, "kids": []}]}'),
    (2, '{"v": 1, "kids": [{"v": "x", "kids": []}]}'),
    (3, '{"counts": {"a": 1.5}, "any": 1, "list": []}'),
    (1, '{"id": 1, "tags": ["a", "b", "c",'),  # a comma past maxItems: no way on from there
    (4, '[1]'),
    (4, '[1, "2"]'),
    (5, '"abcd"'),
    (5, '"b"'),
    (6, '{"a": 1, "ab": "x", "d": 2}'),   # the required b left out
    (6, '{"b": true, "a": 1, "d": 2}'),   # out of order
    (6, '{"b": true}'),                    # the required d left out
    (6, '{"a": 1, "a": 2, "b": true, "d": 1}'),  # twice
    (6, '{"ab": "x", "b": true, "c": null, "d": 1, "e": 1}'),
    (7, '{"kind": "circle", "w": 1, "h": 2}'),    # a rect's properties after circle
    (7, '{"kind": "square", "r": 1}'),
    (7, '{"kind": "rect", "w": 1}'),               # h left out
    (7, '{"r": 1, "kind": "circle"}'),             # out of order
    (7, '1.5.'),
    (7, 'true'),
    (8, '[]'),
    (8, '[{"name": "get_time", "parameters": {"city": "x"}}]'),
    (8, '[{"name": "get_weather", "parameters": {"tz": "x"}}]'),
    (8, '[{"name": "nope", "parameters": {}}]'),
    (8, '[{"parameters": {"tz": "x"}, "name": "get_time"}]'),
    (9, '{"item": {"id": 1, "t": "a"}, "pick": {"a": 1}, "more": {"id": 1, "z": true}, "word": "a"}'),
    (9, '{"item": {"id": 1, "t": "c"}, "pick": {"a": 1}, "more": {"id": 1, "z": true}, "word": "a"}'),
    (9, '{"item": {"t": "b", "id": 1}, "pick": {"a": 1}, "more": {"id": 1, "z": true}, "word": "a"}'),
    (9, '{"item": {"id": 1, "t": "b"}, "pick": {}, "more": {"id": 1, "z": true}, "word": "a"}'),
    (9, '{"item": {"id": 1, "t": "b"}, "pick": {"a": 1}, "more": {"id": 1}, "word": "a"}'),
    (9, '{"item": {"id": 1, "t": "b"}, "pick": {"a": 1}, "more": {"id": 1, "z": true}, "word": 1}'),
] + [(10, BASE10.replace(a, b, 1)) for a, b in [
    ('"ab"', '"a"'), ('"ab"', '"abcde"'), ('"ab"', '"\\u00e9\\ud83d\\ude00\\n\\"x"'), ('"Ana"', '"An"'),
    ('"Ana"', '"\\ud83d\\ude00\\u00e9"'), ('null', '"123456"'), ('18,', '17,'), ('18,', '131,'), ('18,', '18.5,'),
    ('18,', '1800,'), ('-9,', '-10,'), ('-9,', '10,'), ('0.5,', '1.5,'), ('0.5,', '-0.1,'), ('0.5,', '1.01,'),
    ('0.5,', '1.0001,'), ('-2.5,', '-5,'), ('-2.5,', '-5.0,'), ('-2.5,', '-1.9,'), ('-2.5,', '-1.999,'),
    ('1000,', '999,'), ('1000,', '-1000,'), ('-7,', '-6,'), ('-7,', '7,'), ('1,', '0,'), ('1,', '4,'),
    ('"abc"}', '"a"}'), ('"abc"}', '30}'), ('0.5,', '5e-1,')]] + [
    (11, '{"pt": [1, 2, 3], "row": ["ab", "x"], "opt": []}'),      # items false: two only
    (11, '{"pt": [1], "row": ["ab", "x"], "opt": []}'),            # minItems 2
    (11, '{"pt": [1, 2], "row": ["abcd", "x"], "opt": []}'),
    (11, '{"pt": [1, 2], "row": ["ab", "z"], "opt": []}'),
    (11, '{"pt": [1, 2], "row": ["ab", "x", "7"], "opt": []}'),    # the rest integers
    (11, '{"pt": [1, 2], "row": ["ab", "x"], "opt": ["a"]}'),      # the first an integer
    (11, '{"pt": [1, 2], "row": ["ab", "x"], "opt": [1, "a", "b", "c"]}'),
    (12, PYD_OK.replace('{"pet_type": "cat", "meows": 3}', '{"pet_type": "cat", "barks": 3}')),
    (12, PYD_OK.replace('{"pet_type": "cat", "meows": 3}', '{"pet_type": "cat", "meows": 11}')),
    (12, PYD_OK.replace('"age": 30', '"age": -1')),
    (12, PYD_OK.replace('[1, 2]', '[1, 2, 3]')),
    (12, PYD_OK.replace('"red"', '"blue"')),
    (12, PYD_OK.replace('"city": "Oslo"', '"city": ""')),
    (14, '[5]'), (14, '[9]'), (14, '[6, 10]'),
    (15, '[true, null, 1, 2]'), (15, '[null]'), (15, '[true, 1]'), (15, '[]')]
for si in range(len(SCHEMAS)):
    cases = [t for i, t in REFUSE if i == si]
    rc, out, _ = run(SCHEMAS[si], cases)
    for t, o in zip(cases, out):
        # never whole; one that ends in a comma with no way on is refused at that comma
        if o == "whole" or (t.endswith(",") and o != "refused %d" % (len(t) - 1)):
            fails.append((si, "a text the schema must refuse taken", t, o))

# each pattern against Python's re.search, where it means what ECMA-262's does too (regex_nfa.h:
# \\d \\w \\s over ASCII, a final $ the text's end, not before a last line break): random
# strings from its examples' characters, the examples and their one-character edits, as JSON
# strings (\\u escapes or not): whole exactly when it matches; no cut of a match refused
def both_dialects(pat, x):
    return re.search(re.sub(r"\$$", r"\\Z", pat), x, re.ASCII) is not None

for pat, examples in PATTERNS.items():
    chars = sorted(set("".join(examples)) | set("aZ0-@. \\\"\n\u00e9\U0001F600"))
    strs = list(examples) + ["".join(rng.choice(chars) for _ in range(rng.randint(0, 12))) for _ in range(300)]
    for e in examples:
        for _ in range(40):
            at, kind = rng.randrange(len(e) + 1), rng.randrange(3)
            strs.append(e[:at] + (rng.choice(chars) if kind != 1 else "") + e[at + (kind != 0):])
    texts = [json.dumps(x, ensure_ascii=rng.random() < 0.5) for x in strs]
    rc, out, err = run({"type": "string", "pattern": pat}, texts)
    assert rc == 0, (pat, out, err)
    n_match = 0
    for x, t, o in zip(strs, texts, out):
        want = both_dialects(pat, x)
        n_match += want
        if (o == "whole") != want: fails.append(("pattern", pat, "whole" if want else "not whole", t, o))
    cuts = [t[:k] for x, t in zip(strs, texts) if both_dialects(pat, x) for k in range(1, len(t))]
    rc, out, _ = run({"type": "string", "pattern": pat}, cuts)
    for t, o in zip(cuts, out):
        if o.startswith("refused"): fails.append(("pattern", pat, "a cut of a match refused", t, o))
    print("pattern %s: %d strings, %d match, as re.search says" % (pat, len(strs), n_match))
    assert n_match >= len(examples), pat

# \\u escapes under a class of the BMP: no digit is taken that only a pair's high half (an
# astral character, outside the class) or a lone low half could go on from
rc, out, _ = run({"type": "string", "pattern": "^[\u0001-\uffff]$"},
                 ['"\\ud83d', '"\\ud', '"\\ud7ff"', '"\\ue000"', '"\\udc00'])
if out != ["refused 4", "prefix", "whole", "whole", "refused 4"]: fails.append(("pattern", "BMP escapes", out))

# the texts the refused ones above vary are taken whole
for si, base in ((10, BASE10), (12, PYD_OK)):
    rc, out, _ = run(SCHEMAS[si], [base])
    if out != ["whole"]: fails.append((si, "the base of the refused texts not taken whole", base, out))

# schemas tpinfer refuses, naming the keyword
BAD = [({"type": "string", "pattern": "(?=a)"}, "lookaround"), ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
       ({"type": "string", "pattern": "a^"}, "^ or $ other than at the pattern's ends"),
       ({"type": "string", "pattern": "[a"}, "without its ']'"), ({"type": "string", "pattern": "a{2,1}"}, "m less than n"),
       ({"type": "string", "pattern": "\\p{L}"}, "\\p"), ({"type": "string", "pattern": "[]"}, "begins with ']'"),
       ({"type": "string", "pattern": "(?i)a"}, "flags"), ({"type": "string", "pattern": "a" * 128}, "more than 127"),
       ({"type": "string", "pattern": "a**"}, "quantifier after a quantifier"),
       ({"type": "string", "pattern": "(a"}, "without its ')'"), ({"type": "string", "pattern": "a)"}, "without its '('"),
       ({"type": "string", "pattern": "a{1001}"}, "past 1000"), ({"type": "string", "pattern": "\\x4"}, "two hex digits"),
       ({"type": "string", "pattern": "a{x}"}, "not a quantifier"), ({"type": "string", "pattern": "*a"}, "nothing to repeat"), ({"type": "string", "pattern": 5}, "pattern"),
       ({"type": "string", "pattern": "^[^\\s\\S]$"}, "\\S inside a class"), ({"type": "integer", "multipleOf": 2}, "multipleOf"),
       ({"type": "number", "maximum": 0.5}, "maximum that is not a whole number"),
       ({"type": "integer", "minimum": 5, "maximum": 4}, "no number is within"),
       ({"type": "string", "minLength": 3, "maxLength": 2}, "maxLength"), ({"type": "string", "minLength": "2"}, "minLength"),
       ({"enum": ["a"], "minLength": 2}, "within its bounds"), ({"uniqueItems": True}, "uniqueItems"), ({"oneOf": [{"type": "string"}, {"enum": ["a"]}]}, "oneOf[0] and oneOf[1]"),
       ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, "oneOf[0] and oneOf[1]"),
       ({"oneOf": [{"properties": {"t": {"const": 1}}, "required": ["t"]}, {"properties": {"t": {"enum": [2, 1.0]}}, "required": ["t"]}]}, "oneOf[0] and oneOf[1]"),
       ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "required"),
       ({"$ref": "#/$defs/missing"}, "$ref"), ({"type": "thing"}, "thing"), ({"allOf": []}, "allOf"),
       ({"type": "number", "exclusiveMaximum": "5"}, "exclusiveMaximum must be a number (or draft 4's boolean)"),
       ({"allOf": [{"type": "string"}, 5]}, "allOf holds a schema that is not an object"),
       ({"anyOf": [{"type": "string"}, 5], "minLength": 1}, "(a schema must be an object or true)"),
       ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "type"), ({"allOf": [{"pattern": "x"}, {"pattern": "y"}]}, "pattern is given twice"),
       ({"allOf": [{"enum": ["a"]}, {"enum": ["b"]}]}, "enum"), ({"type": "string", "enum": [1, None]}, "enum"),
       ({"anyOf": [{"type": "object", "properties": {"k": {"const": i}}} for i in range(65)]}, "more than 64"),
       ({"allOf": [{"prefixItems": [{}]}, {"prefixItems": [{"type": "string"}]}]}, "prefixItems is given twice"),
       ({"enum": [[1]]}, "enum"), (False, "false"), ({"$ref": "#"}, "leads back to itself"),
       ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "leads back to itself"),
       ({"allOf": [{"$ref": "#"}]}, "nest too deep"), (json.loads('{"items": ' * 70 + '{}' + '}' * 70), "nests too deep"),
       # a pattern of 200,000 nested groups overflowed the parser's stack (the whole job died);
       # nested repeats of empty groups took 11 s for three levels (the one here), hours for four
       ({"type": "string", "pattern": "(" * 200000 + "a" + ")" * 200000}, "groups nested more than 100 deep"),
       ({"type": "string", "pattern": "((((){1000}){1000}){1000})a"}, "expand to more than 100000 atoms"),
       # the message quotes a long pattern's first 120 bytes, cut between characters (byte 120
       # is inside the first "é"): valid UTF-8, and the reason after it
       ({"type": "string", "pattern": "a" * 119 + "\u00e9" * 10}, "more than 127")]
# 100 nested groups are taken (the bound is past what a written pattern needs)
rc, out, _ = run({"type": "string", "pattern": "^" + "(" * 100 + "a" + ")" * 100 + "$"}, ['"a"', '"b"'])
if out != ["whole", "refused 1"]: fails.append(("pattern", "100 nested groups", out))
for schema, word in BAD:
    rc, out, err = run(schema, [])
    if rc != 2 or not out or word not in out[0]: fails.append(("bad", "schema not refused by name", json.dumps(schema), out))
for f in fails[:10]:
    print("FAIL", str(f)[:400]) # a cut: some schemas here are 400 KB
sys.exit(1 if fails else 0)
