"""An embedded, generated corpus so Sluice trains and serves without downloading anything.

Sentences follow a small grammar with consistent facts (animals eat what they eat, places have
their weather), so a tiny model learns something measurable: loss falls well below uniform and
"predict the next word" gives sensible answers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ANIMALS = {
    "cat": ["fish", "milk"],
    "dog": ["bones", "meat"],
    "horse": ["hay", "apples"],
    "rabbit": ["carrots", "lettuce"],
    "bird": ["seeds", "berries"],
    "cow": ["grass", "hay"],
    "bear": ["honey", "berries"],
    "mouse": ["cheese", "seeds"],
}
PLACES = {
    "the mountains": "snow",
    "the desert": "sunshine",
    "the coast": "wind",
    "the forest": "rain",
    "the city": "fog",
    "the valley": "mist",
}
ADJECTIVES = ["small", "old", "quiet", "happy", "brown", "young", "lazy", "clever"]
NAMES = ["Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Hugo"]
TIMES = ["in the morning", "at noon", "in the evening", "at night"]
TEMPLATES = (
    "The {adj} {animal} eats {food} {time}.",
    "{name} gave the {animal} some {food}.",
    "In {place} there is often {weather}.",
    "{name} walked to {place} {time} and saw the {weather}.",
    "Every {animal} likes {food}, and the {adj} {animal} likes it most.",
    "{name} lives near {place}, where the {weather} comes {time}.",
    "The {animal} and the {animal2} are friends.",
    "When {name} feeds the {animal}, it gets {food}.",
)


# A second topic with its own words (and numbers): text the animal corpus never shows, for
# drift (a model trained on animals meets kitchen talk) and for retraining on new data.
INGREDIENTS = ["flour", "butter", "sugar", "rice", "cream", "honey", "lentils", "cheese"]
VEGETABLES = ["onions", "carrots", "peppers", "leeks", "tomatoes", "potatoes"]
SPICES = ["salt", "pepper", "cumin", "paprika", "ginger", "nutmeg"]
DISHES = ["the stew", "a risotto", "the pancakes", "a curry", "the omelette", "a tart"]
KITCHEN = (
    "Mix the {ingredient} with the {ingredient2} and bake it for {minutes} minutes.",
    "{name} chops the {vegetable} on the wooden board.",
    "The soup needs more {spice} before dinner.",
    "Heat the oven to {degrees} degrees and wait {minutes} minutes.",
    "{name} serves {dish} with fresh {vegetable}.",
    "Stir {minutes} grams of {spice} into {dish}.",
)


def kitchen_sentence(rng: random.Random) -> str:
    a, b = rng.sample(INGREDIENTS, 2)
    return rng.choice(KITCHEN).format(
        ingredient=a,
        ingredient2=b,
        minutes=rng.choice([5, 10, 15, 20, 30, 45]),
        name=rng.choice(NAMES),
        vegetable=rng.choice(VEGETABLES),
        spice=rng.choice(SPICES),
        degrees=rng.choice([160, 180, 200, 220]),
        dish=rng.choice(DISHES),
    )


def sentence(rng: random.Random) -> str:
    animal, animal2 = rng.sample(sorted(ANIMALS), 2)
    place = rng.choice(sorted(PLACES))
    return rng.choice(TEMPLATES).format(
        adj=rng.choice(ADJECTIVES),
        animal=animal,
        animal2=animal2,
        food=rng.choice(ANIMALS[animal]),
        name=rng.choice(NAMES),
        place=place,
        weather=PLACES[place],
        time=rng.choice(TIMES),
    )


TOPICS = {"animals": sentence, "kitchen": kitchen_sentence}


def generate(n: int, seed: int = 0, topic: str = "animals") -> list[str]:
    """n sentences, deterministic for a seed (duplicates possible, as in real data)."""
    rng = random.Random(seed)
    make = TOPICS[topic]
    return [make(rng) for _ in range(n)]


def write_corpus(path: Path, n: int, seed: int = 0, topic: str = "animals") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(generate(n, seed, topic)) + "\n", encoding="utf-8")
    return path


SAMPLE_PROMPTS = [
    "The lazy cat eats",
    "In the desert there is often",
    "Anna gave the rabbit some",
    "When Ben feeds the dog, it gets",
    "Every horse likes",
]


def sample_files() -> dict[str, list[str]]:
    """The demos' two prompt files, as lines: generation prompts, and a mix of scoring,
    next-token and one malformed line (it gets an error line, the others are answered)."""
    prompts = [
        {"id": f"p{i}", "text": p, "parameters": {"max_new_tokens": 12}}
        for i, p in enumerate(SAMPLE_PROMPTS)
    ]
    mixed = [
        {"id": "s1", "task": "score", "text": "The lazy cat eats fish in the morning."},
        {"id": "s2", "task": "score", "text": "Morning the in fish eats cat lazy the."},
        {
            "id": "n1",
            "task": "next_token",
            "text": "Every rabbit likes",
            "parameters": {"top_k": 3},
        },
    ]
    return {
        "prompts.jsonl": [json.dumps(r) for r in prompts],
        "mixed.jsonl": [*(json.dumps(r) for r in mixed), "{this line is not JSON}"],
    }
