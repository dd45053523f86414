"""marl.registry.Registry: closed registries hold exactly their Enum's members; open ones take a registered
variant or a plugin module's, and refuse anything else with the key and the choices."""

from __future__ import annotations

import sys
from enum import StrEnum

import pytest

from marl.registry import Registry


class Colour(StrEnum):
    red = "red"
    blue = "blue"


def test_a_closed_registry_is_its_enums_members_in_order():
    colours = Registry("paint.colour", {"red": 1, "blue": 2}, names=Colour)
    assert colours.names() == ("red", "blue") and colours["blue"] == 2 and colours[Colour.red] == 1
    for wrong in ({"red": 1}, {"blue": 2, "red": 1}, {"red": 1, "blue": 2, "green": 3}):
        with pytest.raises(ValueError, match="a variant for every member of Colour"):
            Registry("paint.colour", wrong, names=Colour)
    with pytest.raises(ValueError, match="paint.colour is closed"):
        colours.register("green", 3)
    with pytest.raises(ValueError, match=r"paint\.colour must be one of red, blue; got 'green'"):
        colours["green"]


def test_a_builtin_named_by_path_is_imported_on_first_use():
    sys.modules.pop("colorsys", None)
    lazy = Registry("paint.space", {"hls": "colorsys:rgb_to_hls"})
    assert "colorsys" not in sys.modules
    assert lazy["hls"](1.0, 0.0, 0.0) == (0.0, 0.5, 1.0) and "colorsys" in sys.modules


def test_an_open_registry_registers_and_unregisters_without_touching_an_enum():
    paints = Registry("paint.kind", {"oil": "o"})
    assert paints.register("acrylic", "a") == "acrylic"
    assert paints.names() == ("oil", "acrylic") and paints["acrylic"] == "a"
    assert paints.problem("acrylic") is None
    with pytest.raises(ValueError, match="registered already"):
        paints.register("oil", "x")
    with pytest.raises(ValueError, match="is built in"):
        paints.unregister("oil")
    paints.unregister("acrylic")
    assert paints.problem("acrylic") == "paint.kind must be one of oil; got 'acrylic'"
    with pytest.raises(ValueError, match="is not registered"):
        paints.unregister("acrylic")


def test_a_plugin_module_declares_its_variant(tmp_path):
    paints = Registry("paint.kind", {"oil": "o"}, declares="PAINT")
    good, bare = tmp_path / "gouache.py", tmp_path / "bare.py"
    good.write_text("PAINT = 'gouache'\n")
    bare.write_text("OTHER = 1\n")
    assert paints[str(good)] == "gouache" and paints.names() == ("oil",)  # a path is a value, not a name
    assert paints.problem(str(bare)) == f"paint.kind={bare}: {bare} declares no PAINT"
    assert "cannot be imported" in str(paints.problem("no_such_pkg.paint"))
    # A bare word is never a module: a typo of a built-in is refused with the choices.
    assert paints.problem("oli") == ("paint.kind must be one of oil, or a module path (a module declaring "
                                     "PAINT); got 'oli'")
    assert paints.label().endswith("(a module declaring PAINT)")
    typed = Registry("paint.kind", {}, declares="PAINT", declared=int)
    assert typed.problem(str(good)) == f"paint.kind={good}: PAINT must be a int; got 'gouache'"
