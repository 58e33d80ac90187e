"""bench/plot.py on the fixtures in bench/fixtures (run by scripts/test:
python3 -m unittest discover -s bench -p 'test_*.py')."""

import os
import tempfile
import unittest
import xml.etree.ElementTree as ET

import plot

HERE = os.path.dirname(os.path.abspath(__file__))
MD = os.path.join(HERE, "fixtures", "results.md")
CSV = os.path.join(HERE, "fixtures", "results.csv")
SVG = "{http://www.w3.org/2000/svg}"


def by_key(rows):
    return {(r["workload"], r["clients"], r["target"]): r for r in rows}


def lines(root):
    """{(panel title, target): [(x, y), ...]} of every polyline, the title being the text just
    before it."""
    out, title = {}, None
    for el in root.iter():
        if el.tag == SVG + "text" and el.get("class") == "t":
            title = el.text
        if el.tag == SVG + "polyline":
            pts = [tuple(map(float, p.split(","))) for p in el.get("points").split()]
            out[(title, el.get("data-target"))] = pts
    return out


class ReadResults(unittest.TestCase):
    def test_markdown_tables_give_tps_and_cpu_per_target(self):
        rows = by_key(plot.read_md(MD))
        self.assertEqual(rows[("select-simple", 16, "pgbouncer125")]["tps"], 20000.0)
        self.assertEqual(rows[("select-simple", 100, "pgcarpool")]["cpu_us_per_txn"], 21.0)
        # ERR and n/a are no figure; direct has no CPU column; ratio columns are no target.
        self.assertIsNone(rows[("select-simple", 1000, "pgcarpool")]["tps"])
        self.assertIsNone(rows[("select-simple", 1000, "pgcarpool")]["cpu_us_per_txn"])
        self.assertNotIn("cpu_us_per_txn", rows[("select-simple", 16, "direct")])
        self.assertFalse(any("/" in t for (_, _, t) in rows))

    def test_csv_and_markdown_agree(self):
        md, csv_ = by_key(plot.read_md(MD)), by_key(plot.read_csv(CSV))
        self.assertEqual(set(md), set(csv_))
        for k in md:
            for key, _ in plot.METRICS:
                self.assertEqual(md[k].get(key), csv_[k].get(key), (k, key))


class Svg(unittest.TestCase):
    def setUp(self):
        self.rows = plot.read_md(MD)
        self.root = ET.fromstring(plot.svg(self.rows))

    def test_only_workloads_with_two_client_counts_are_plotted(self):
        self.assertEqual(plot.plotted_workloads(self.rows), ["select-simple"])
        titles = [el.text for el in self.root.iter(SVG + "text") if el.get("class") == "t"]
        self.assertIn("select-simple: transactions per second", titles)
        self.assertFalse(any(t.startswith("tpcb") for t in titles))

    def test_one_line_per_target_and_metric_through_its_points(self):
        ls = lines(self.root)
        tps, cpu = "select-simple: transactions per second", "select-simple: pooler CPU µs per transaction"
        self.assertEqual({t for (p, t) in ls if p == tps}, {"direct", "pgbouncer125", "pgcarpool"})
        self.assertEqual({t for (p, t) in ls if p == cpu}, {"pgbouncer125", "pgcarpool"})
        # pgcarpool's failed 1000-client run leaves its line two points long.
        self.assertEqual(len(ls[(tps, "pgcarpool")]), 2)
        self.assertEqual(len(ls[(tps, "direct")]), 3)
        # More clients to the right; more tps higher up (smaller y).
        d = ls[(tps, "direct")]
        self.assertLess(d[0][0], d[1][0])
        self.assertLess(d[0][1], d[1][1])  # 30,000 above 28,000
        b = ls[(tps, "pgbouncer125")]
        self.assertLess(d[0][1], b[0][1])  # direct 30,000 above bouncer 20,000
        # y is linear from 0: 20,000 is two thirds of 30,000's height above the axis.
        axis = max(float(el.get("y1")) for el in self.root.iter(SVG + "line"))
        self.assertAlmostEqual((axis - b[0][1]) / (axis - d[0][1]), 2 / 3, places=2)

    def test_legend_names_every_target(self):
        texts = [el.text for el in self.root.iter(SVG + "text")]
        for t in ("direct", "pgbouncer125", "pgcarpool"):
            self.assertIn(t, texts)

    def test_write_skips_results_with_nothing_to_plot(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plot.svg")
            tpcb = [r for r in self.rows if r["workload"] == "tpcb"]
            self.assertFalse(plot.write(path, tpcb))
            self.assertFalse(os.path.exists(path))
            self.assertTrue(plot.write(path, self.rows))
            ET.parse(path)


if __name__ == "__main__":
    unittest.main()
