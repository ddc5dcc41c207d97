# tests/guided_json.sh: whether a text cut short is the start of a JSON object, by Python's own
# parser: some ending of it (a string, a value, the brackets still open) must parse as one.
import json, sys, itertools

def open_stack(t):
    """The brackets open at the end of t and whether t ends inside a string."""
    stack, in_str, esc = [], False, False
    for ch in t:
        if in_str:
            if esc: esc = False
            elif ch == '\\': esc = True
            elif ch == '"': in_str = False
        elif ch == '"': in_str = True
        elif ch in '{[': stack.append(ch)
        elif ch in '}]' and stack: stack.pop()
    return stack, in_str

def completable(t, kind=dict):
    """Whether some ending makes t one JSON object (a list, with kind=list) (json.loads)."""
    ends_str = ['', '"', '0"', '00"', '000"', '0000"', '\\\\"', 'udc00"', '0\\udc00"', '00\\udc00"', 'dc00"', 'c00"', '00"', '\\udc00"']
    ends_val = ['', '{}', '0', ':0', '"":0', 'rue', 'ue', 'e', 'alse', 'lse', 'se', 'ull', 'll', 'l', '":0', ' 0', '"']
    for a, b in itertools.product(ends_str, ends_val):
        u = t + a + b
        stack, in_str = open_stack(u)
        if in_str: continue
        for pre in ['', ':0', '0']:
            v = u + pre + ''.join('}' if c == '{' else ']' for c in reversed(stack))
            try:
                if isinstance(json.loads(v), kind): return True
            except ValueError:
                pass
    return False
