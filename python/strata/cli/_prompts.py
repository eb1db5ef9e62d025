"""The built-in calibration prompts of `strata-fill profile`: varied on purpose (code, prose,
chat, reasoning, other languages and scripts) so the profile sees the experts a general
workload routes to."""

DEFAULT_PROMPTS: tuple[str, ...] = (
    # code
    "Write a Python function that merges two sorted lists into one sorted list, with tests.",
    "Explain what this Rust code does and fix the bug:\n"
    "fn mean(v: &[f64]) -> f64 { v.iter().sum::<f64>() / v.len() as f64 }",
    "Write a SQL query that returns the top 5 customers by total order value in 2023.",
    "In JavaScript, how do I debounce a function? Show an implementation.",
    # prose
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Summarize the causes of the French Revolution in three paragraphs.",
    "Describe how photosynthesis works to a ten-year-old.",
    # chat
    "Hi! Can you help me plan a three-day trip to Kyoto in autumn?",
    "I have a job interview tomorrow for a data analyst role. What should I prepare?",
    # reasoning and maths
    "A train leaves at 9:40 and arrives at 13:15. How long is the trip? Show your steps.",
    "Prove that the square root of 2 is irrational.",
    # other languages
    "Explique la différence entre un virus et une bactérie.",
    "Schreibe eine kurze E-Mail, um einen Termin beim Zahnarzt zu verschieben.",
    "¿Cuáles son las ventajas y desventajas de la energía solar?",
    "请用简单的语言解释什么是机器学习。",
    "日本の四季について短い文章を書いてください。",
    "Расскажи кратко историю Санкт-Петербурга.",
    "اكتب فقرة قصيرة عن أهمية القراءة.",
)
