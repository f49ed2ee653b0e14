"""Open-ended chat instructions, written here, for drafts of a target that answers its own prompts.

A draft learns what its target writes for the prompts it is trained on (the DeepSpec recipe: the target
answers, the draft imitates). The corpus' chat domain (recipes/embedded/corpus.py) is Python documentation
phrased as questions ("Explain <heading>."), which is the only prose every machine has, and is what the
embedded target learns to write; a pretrained chat target answers it in the voice of a manual. MT-Bench asks for
letters, stories, advice, comparisons, explanations and role play, and a real target answers those in its
assistant voice, which a draft trained on manual-style answers has not seen. These instructions ask for that
kind of text. They carry no answers: only a target that answers itself can use them, so only the real build
does (`DraftPreset.instruction_prompts`).

Every instruction is one of the templates below filled with one of its kind's subjects, ordered by a hash of
the pair (deterministic, seed-free, as the corpus is). None is taken from an evaluation set: the templates name
genres of request, the subjects everyday, school and working-life topics.
"""

from __future__ import annotations

import hashlib

# kind → subjects: a template takes the subjects of its kind.
SUBJECTS: dict[str, tuple[str, ...]] = {
    "topic": (
        "the water cycle", "photosynthesis", "the French Revolution", "compound interest", "black holes",
        "the immune system", "plate tectonics", "the printing press", "supply and demand", "climate change",
        "the Roman Empire", "machine learning", "vaccines", "the Silk Road", "renewable energy",
        "the human heart", "inflation", "the Renaissance", "electric cars", "the theory of evolution",
        "the stock market", "earthquakes", "the Industrial Revolution", "sleep", "the moon landing",
        "coral reefs", "democracy", "antibiotics", "the internet", "volcanoes", "the Great Depression",
        "nuclear power", "bees and pollination", "the Cold War", "solar panels", "gravity",
    ),
    "situation": (
        "starting a new job", "moving to a new city", "learning to cook", "preparing for an exam",
        "saving money for a house", "training for a first marathon", "keeping a small garden",
        "working from home", "planning a wedding on a budget", "adopting a dog", "learning a second language",
        "going back to school as an adult", "organising a team offsite", "giving a talk to a large audience",
        "recovering from a sports injury", "caring for an elderly parent", "starting a small bakery",
        "travelling alone for the first time", "reducing screen time", "preparing for a job interview",
        "renovating an old kitchen", "teaching a child to ride a bike", "running a book club",
        "switching careers into nursing", "hosting a dinner party", "camping in the mountains",
    ),
    "character": (
        "a lighthouse keeper", "a medieval blacksmith", "a retired astronaut", "a ship's cook",
        "a detective in 1920s London", "a museum guide", "a park ranger", "a baker in Paris",
        "a high school chemistry teacher", "a street musician", "a deep-sea diver", "a train conductor",
        "a librarian in a small town", "a wildlife photographer", "an old sailor", "a robot learning to paint",
        "a farmer during a drought", "a night-shift nurse", "a young inventor", "a mountain guide",
    ),
    "pair": (
        "cats and dogs as pets", "renting and buying a home", "trains and planes for a 500 km trip",
        "paper books and e-readers", "city life and country life", "public and private schools",
        "running and swimming for fitness", "tea and coffee", "working alone and working in a team",
        "electric and gas stoves", "studying in the morning and at night", "email and phone calls at work",
        "a gap year and going straight to university", "cash and card payments", "wind and solar power",
        "handwritten notes and typed notes", "small and large companies to work for", "summer and winter holidays",
    ),
}

# (kind, template): `{}` is the subject.
TEMPLATES: tuple[tuple[str, str], ...] = (
    ("topic", "Explain {} to a ten-year-old."),
    ("topic", "Write a short essay about {}."),
    ("topic", "What are the most common misconceptions about {}?"),
    ("topic", "Give me five interesting facts about {}."),
    ("topic", "Summarise what a student should know about {} in one paragraph."),
    ("topic", "Write a poem about {}."),
    ("topic", "Describe the history of {} in a few paragraphs."),
    ("topic", "How would you explain {} to someone who has never heard of it?"),
    ("topic", "Write three quiz questions about {}, with answers."),
    ("topic", "What are the pros and cons of {} for society?"),
    ("topic", "Outline a one-hour lesson plan on {}."),
    ("topic", "Write a short news article about a new discovery related to {}."),
    ("situation", "Give me practical advice for {}."),
    ("situation", "Make a step-by-step plan for {}."),
    ("situation", "Write an email to a friend about {}."),
    ("situation", "What mistakes do people often make when {}?"),
    ("situation", "Write a short blog post about {}."),
    ("situation", "Create a checklist for {}."),
    ("situation", "I am nervous about {}. What should I keep in mind?"),
    ("situation", "Write a motivational message for someone who is {}."),
    ("situation", "What questions should I ask myself before {}?"),
    ("character", "Write a short story told by {}."),
    ("character", "Pretend you are {}. Describe a typical day."),
    ("character", "Write a diary entry from {} after a difficult day."),
    ("character", "Imagine an interview with {}. Write the questions and the answers."),
    ("character", "Write a letter from {} to their younger self."),
    ("character", "Describe the workplace of {} using all five senses."),
    ("pair", "Compare {}."),
    ("pair", "Write a balanced argument about {}."),
    ("pair", "Make a table comparing {}, then give a recommendation."),
    ("pair", "Which would you choose between {}, and why?"),
    ("pair", "Write a dialogue between two friends who disagree about {}."),
)


def instruction_prompts(n: int) -> list[str]:
    """The first `n` instructions in hash order of (template, subject): the same list on every machine."""
    pairs = [(template.format(subject), f"{template}|{subject}")
             for kind, template in TEMPLATES for subject in SUBJECTS[kind]]
    pairs.sort(key=lambda p: hashlib.sha256(p[1].encode()).hexdigest())
    if n > len(pairs):
        raise ValueError(f"{n} instruction prompts asked for; there are {len(pairs)}")
    return [text for text, _ in pairs[:n]]


def count() -> int:
    return sum(len(SUBJECTS[kind]) for kind, _ in TEMPLATES)

