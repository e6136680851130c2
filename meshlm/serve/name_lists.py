"""Given names and surnames that ship with the sanitizer (no download), chosen to span many languages.

A capitalised word from :data:`GIVEN_NAMES` starts a person's name; one from :data:`SURNAMES` after a
capitalised word ends one. :data:`AMBIGUOUS_GIVEN` are also ordinary words, places or months ("Will", "May",
"Jordan", "Paris"): they count only with a capitalised surname after them or a context word before them.
"""

from __future__ import annotations

GIVEN_NAMES = frozenset("""
Aaron Abby Abdul Abdullah Abebe Abigail Abraham Ada Adam Adaeze Adebayo Adeline Aditi Aditya Adrian Adriana Afua
Agnes Ahmed Ahmad Aiden Aiko Aisha Ajay Akira Akosua Alan Alana Albert Alberto Aleksandr Aleksandra Alejandro Alessandro
Alessia Alex Alexa Alexander Alexandra Alexei Alexis Alfonso Alfred Ali Alice Alicia Alina Alison Alistair Allison
Alma Alok Alvaro Alyssa Amal Amanda Amara Amelia Amina Amir Amit Amy Ana Anan Anand Ananya Anastasia Anders Andre
Andrea Andreas Andrei Andres Andrew Andrzej Andy Angela Angelica Angelo Anil Anita Anja Anjali Ann Anna Anne Annette
Annika Anthony Antoine Anton Antonio Anuj Anya Aoife Arash Arjun Arnav Arthur Arturo Arun Asha Ashley Ashok Astrid
Aubrey Audrey Ava Avery Axel Aya Ayaan Ayesha Ayodele Ayumi Azadeh Bao Barbara Barry Bartosz Beatrice Beatriz Bella
Ben Benedict Benjamin Bernard Bernardo Beth Bethany Betty Bianca Bilal Bjorn Blessing Bogdan Boris Brad Bradley
Brandon Brenda Brian Bridget Brittany Bruce Bruno Bryan Caitlin Caleb Camila Camille Candice Carl Carla Carlos
Carmen Carol Caroline Carolyn Cassandra Catalina Catherine Cecilia Cedric Celine Chandra Chantal Charles Charlie
Chen Cheng Chiamaka Chidi Chinedu Chinonso Chioma Chloe Chris Christian Christina Christine Christopher Chukwuemeka
Cindy Claire Clara Claudia Colin Connor Constance Cristina Cynthia Dagny Daisuke Dale Damian Damien Dan Dana Daniel
Daniela Daniele Danielle Danny Daria Darius Darren Dave David Dawit Deborah Deepa Deepak Denis Dennis Derek Desmond
Devon Diana Diane Diego Dimitri Dmitri Dmitry Dominic Dominik Donald Donna Doris Dorothy Douglas Duc Dylan Ebony
Eduardo Edward Edwin Efua Eileen Elaine Elena Eleni Eleanor Eli Elias Elif Elijah Elisa Elizabeth Ella Ellen Elliot
Emeka Emily Emma Emmanuel Emre Enrique Eric Erica Erik Erin Ernesto Esperanza Esther Ethan Eugene Eva Evan Evelyn
Fabian Fabio Farah Farhan Fatima Fatma Federico Felipe Felix Fernanda Fernando Filip Fiona Florian Folake Francesca
Francesco Francis Francisco Franco Franz Freya Gabriel Gabriela Gabrielle Gareth Gary Gaurav Gavin Genevieve
Georg George Georgios Gerald Gerard Gerhard Gianluca Gilbert Gina Giorgio Giovanni Giulia Giuseppe Gloria Gonzalo
Gordon Graham Gregory Greta Guadalupe Guillaume Gustavo Hamza Hana Hannah Hans Haruki Haruto Hassan Hector Heidi
Helen Helena Helga Henrik Henry Hiroshi Hoang Hugo Hui Hyun Ian Ibrahim Ifeoma Igor Ikechukwu Ilya Imani Imran Ines
Ingrid Irene Iris Isaac Isabel Isabella Isabelle Ishaan Isla Ismail Ivan Ivana Jacob Jacqueline Jake James Jamie
Jan Jana Jane Janet Janice Jasmine Jason Javier Jayden Jean Jeffrey Jelena Jennifer Jenny Jeremy Jerome Jessica
Jesus Jiho Jin Joan Joanna Joao Joaquin Jocelyn Joe Joel Johan Johann Johanna John Jonas Jonathan Jorge Jose Josef
Joseph Josephine Joshua Juan Judith Julia Julian Juliana Julie Julien Julio Julius Jun Juan Junaid Jurgen Justin
Kaito Kamala Kareem Karen Karim Karin Karina Karl Kasia Katarzyna Kate Katherine Kathleen Kathryn Katie Katrin
Kavya Kayode Keiko Keith Kelechi Kelly Kemal Ken Kenji Kenneth Kevin Khadija Khalid Kim Kimberly Kiran Kofi Koji
Krishna Kristen Kristina Krzysztof Kumar Kwabena Kwame Kyle Lakshmi Lara Lars Laura Lauren Lawrence Leah Lei Leila
Lena Leon Leonardo Leonie Liam Lidia Liliana Linda Lindiwe Lionel Lisa Lorenzo Louis Louise Luca Lucas Lucia Luciana
Lucy Luis Luisa Lukas Luke Lydia Mads Magdalena Mahmoud Maite Malik Manoj Manuel Manuela Marc Marcel Marco Marcos
Marcus Margaret Margarita Maria Mariam Marie Marina Mario Marisol Marius Marta Martha Martin Mary Mateo Mateus
Matteo Matthew Matthias Maureen Maurice Max Maxim Maximilian Maya Megan Mehmet Mei Melanie Melissa Mia Michael
Michaela Michel Michelle Miguel Mikael Mikhail Milan Milica Min Ming Minh Miriam Mohamed Mohammad Mohammed Monica
Monique Morgan Moses Muhammad Mustafa Nadia Nadine Nam Nancy Naomi Naoko Natalia Natalie Natasha Nathan Nathaniel
Neha Neil Nelson Ngozi Nia Nicholas Nicola Nicolas Nicole Niamh Nikhil Niklas Nikolai Nikos Nina Noah Noor Nora
Nuno Obinna Oksana Olga Oliver Olivia Olumide Olusegun Omar Oscar Oskar Owen Pablo Pamela Paola Paolo Parisa Patricia
Patrick Paul Paula Pauline Pavel Pedro Peter Petra Philip Philippe Pierre Pietro Piotr Pooja Prakash Pranav Priya
Priyanka Rachel Rafael Rahul Raj Rajesh Ramesh Ramon Rana Randy Raphael Rashid Raul Ravi Rebecca Reza Ricardo
Richard Rita Robert Roberta Roberto Robin Rodrigo Rohan Roman Ronald Rosa Rosalind Ruby Rui Ruth Ryan Ryo Sabine
Sachin Sadia Sahil Saif Sakura Salma Salvatore Samantha Samir Samuel Sandeep Sandra Sanjay Santiago Sara Sarah
Sasha Satoshi Scott Sean Sebastian Selin Sergei Sergio Seo Seung Shannon Sharon Shauna Sheila Shirin Shreya Shu
Siddharth Simon Simone Siobhan Sipho Siti Sofia Sophia Sophie Soren Stefan Stefano Stella Stephanie Stephen Steve
Steven Sunita Suresh Susan Sven Svetlana Sylvia Takeshi Tamar Tamara Tanvir Tanya Tariq Taro Teresa Thabo Thanh
Theo Theresa Thomas Timothy Tobias Tom Tomas Tomasz Tommy Tony Tran Tuan Tunde Ulrich Uma Usman Valentina Valeria
Vanessa Varun Vera Veronica Victor Vijay Vikram Vincent Viktor Vivek Vladimir Walter Wanjiru Wei Wen Wendy William
Wojciech Xavier Xiao Xin Yasmin Yasmine Yaw Yelena Yerlan Yi Ying Yohannes Yoko Yong Yosef Yuki Yuna Yusuf Yuto Yuval
Zainab Zahra Zanele Zara Zeynep Zhang Zhao Zoe Zoltan Zsofia
Aarav Abel Abena Abhishek Adaora Adel Adnan Adwoa Afsaneh Agata Agnieszka Ahmet Aidan Ainhoa Aisling Akash Akua
Alba Aldo Aleksander Alexandre Alfredo Alhassan Alinta Alisha Alonso Amadou Amaia Amani Ambrose Ameer Amrita Anahita
Anders Andile Aneesh Angus Anisha Ansel Antonia Anushka Araceli Ari Ariana Arianna Arnold Aryan Ashwin Asif Aslan
Aurelia Aurora Ayo Ayumi Babajide Bakari Baptiste Barış Bastian Beatrix Behrouz Benoit Bernadette Bertrand Bethan
Bhavna Bilge Birgit Bongani Brenna Brigitte Bronwyn Burak Caio Callum Candela Carina Carlota Carsten Cem Chanel
Chantelle Chayton Chibuike Chidinma Chike Chinwe Chiara Chidubem Christoph Ciara Cillian Claudio Clementine Conor
Consuelo Cormac Corinne Cosimo Crispin Cyrus Dalia Damilola Danuta Darko Dariusz Declan Deniz Dermot Dhruv Dieter
Dilnoza Dimitra Divya Dolores Dominika Dong Dorota Dragan Duarte Duncan Dunya Efosa Eilidh Einar Eitan Ekaterina
Elan Eldar Elham Elio Eliana Elisabeth Elodie Eloise Emeka Emilia Emilio Emine Enzo Erika Esi Esra Esteban Ewa
Farid Farida Fergus Fernanda Filippo Finn Finnegan Folasade Francisca Fredrik Funmilayo Gabor Gaspard Gaurang Gemma
Gideon Gintaras Giselle Goran Gustav Gwen Habib Hadiza Hakan Halima Hamid Hania Hannes Harish Hasan Hatice Hayato
Heike Hemant Hiba Hilda Hina Hinata Hirohito Hong Huda Huong Hussein Idris Ifeanyi Ignacio Ilse Ilona Indira Ioana
Irina Isidro Itzel Iwona Jakub Jamal Jamila Janusz Jaroslav Javad Jelle Jeong Jia Jianhua Jiayi Jiho Joanne Jonah
Jorg Joseph Jovana Juliette Jun Jurgen Kaan Kairat Kamal Kamila Kanako Karolina Kasper Katarina Kateryna Kayla Kazuki
Kebede Keisha Kemi Khalil Kiana Kieran Kimani Kirsten Kiyoshi Kolawole Kostas Kristof Kunal Kyoko Ladislav Laila
Lakshman Lamar Latoya Leandro Leilani Leticia Liang Lieve Lin Ling Lisbeth Lorena Lotte Luana Lubna Ludovic Lukasz
Lwazi Mahsa Maja Makoto Malak Malgorzata Mamadou Manon Mansur Marek Mariana Mariusz Marlene Marwa Masato Mathilde
Matias Mattias Maximiliano Mehdi Mei Melek Mercy Mihai Mikko Milos Mina Miroslav Misaki Moana Mohsen Momoko Mónica
Munira Murat Nadir Naledi Nanami Narges Nasser Naveen Nazanin Ngoc Nicolás Nikita Nils Nisha Njeri Nkechi Nnamdi
Noemi Nomvula Nour Nurul Obafemi Odile Ogechi Oladele Olamide Oleksandr Oluwaseun Omari Orla Osagie Oskari Ousmane
Ozan Padraig Panagiotis Parveen Pasquale Patience Pawel Peng Phuong Pilar Pradeep Preeti Qiang Quentin Rabia Radek
Radhika Rafal Ragnar Rania Rasmus Rashida Reem Reinhard Renata Riya Rocio Rohit Roisin Rolf Ronan Rosario Rustam
Ryota Saanvi Sabrina Saeed Safiya Said Saira Sakshi Salman Samira Sanjana Saoirse Sarai Sebastián Seun Shahid
Shanthi Shira Shoira Sigrid Simran Sinead Sione Sizwe Slavko Snezana Soo Sora Stanislav Subhash Sultan Sung Suleiman
Sunil Sushila Swati Sylvain Tadeusz Taiwo Takumi Tatiana Temitope Teodor Thandiwe Thiago Thu Tiago Timur Titilayo
Tomoko Tove Truong Tsubasa Tuomas Ugo Ulla Umar Urszula Vaclav Valentin Vasil Vasile Veronika Vidya Vilma Vinh Vusi
Wambui Wiktoria Wilhelm Xiadani Ximena Yannick Yara Yasmeen Yeon Yerlan Yousef Yulia Yuri Yusra Zaid Zanele Zawadi
Zdenek Zeinab Zhiwei Zlatan Zofia Zuzana
Sam Joe Jim Bob Rob Liz Kate Meg Matt Mike Dave Steve Tony Chris Alex Jess Josh Zach Greg Jeff Jon Phil Rick Ron Ted
Tim Pam Deb Becky Katie Maggie Jenny Lizzie Nate Ollie Charlie Freddie Alfie Harry Archie Gabe Manny Pepe Paco Lupe
Nacho Sasha Misha Kolya Vova Dima Tanya Lena Olya
""".split())

# Ordinary words, places or months too: a person only with a surname after them or a context word before them.
AMBIGUOUS_GIVEN = frozenset("""
Amber April Art August Austin Bill Brook Carol Chance Chase Charlotte Christian Dawn Dean Faith Florence Frank
Georgia Grace Grant Guy Harmony Hope Iris Ivy Jack Jade June Jordan Joy Justice Lily Mark Max May Miles Nick Norman
Paris Pat Penny Rich Rose Ruby Sky Summer Sydney Victoria Violet Will Young Lane Hunter Page Ray Sue Sun Min Nam Kim
Lee Long Adam Victor Mercedes Eve Angel Hunter Chance Patience Mercy Said Sultan Sun Sung Song Lin Ling Jun Mina
Sora Moana Finn Aurora Gemma Dolores Consuelo Rosario Pilar Sabrina Dong Hong Peng Thu Cem Elan Ari Ayo Umar Nour
""".split())

SURNAMES = frozenset("""
Abara Abdullah Adams Adeyemi Afolabi Agarwal Aguilar Ahmed Akhtar Alexander Ali Allen Alvarez Andersen Anderson
Andersson Antonov Appiah Araujo Asante Bailey Baker Banda Banerjee Barbieri Barnes Bauer Becker Bell Bennett Bernard
Bianchi Bose Boateng Brown Bruno Butler Campbell Carter Castillo Castro Chakraborty Chatterjee Chaudhry Chen Cheng
Choi Chowdhury Clark Clarke Collins Colombo Conti Cook Cooper Costa Cruz Dang Das Davies Davis Diallo Diaz Dlamini
Do Dubois Dumont Edwards Eze Fernandes Fernandez Ferrari Fischer Flores Fofana Fontaine Ford Garcia Gomez Gonzalez
Gordon Gray Green Gupta Gutierrez Hall Hansen Harris Hernandez Hill Hoang Hoffmann Hughes Huang Hussain Ibrahim
Ito Ivanov Ivanova Jackson Jain James Jansen Jensen Jimenez Johansson Johnson Jones Joshi Kamau Kang Kapoor Karimi
Kelly Khan Kim Kimura King Kobayashi Koch Kowalski Kowalska Kozlov Kumar Lambert Larsen Laurent Le Lee Lefebvre
Lewis Li Lin Liu Lopez Ma Martin Martinez Mazur Mehta Mendoza Mensah Meyer Miller Mitchell Mohammed Moore Morales
Moreau Moreno Morris Muller Murphy Murray Nakamura Navarro Nel Nelson Ng Nguyen Nielsen Novak Nowak Nunez Obi Odhiambo
Ogunleye Okafor Okeke Okonkwo Olsen Olsson Ortiz Osei Otieno Owusu Park Parker Patel Pereira Perez Petrov Petrova
Pham Phillips Popescu Popov Price Qureshi Rahman Ramirez Ramos Rao Reddy Reyes Ricci Richard Rivera Roberts Robinson
Rodriguez Romano Romero Rossi Roux Russo Saito Sanchez Santos Sato Schmidt Schneider Schulz Scott Shah Sharma Shevchenko
Silva Singh Smith Sokolov Sousa Stewart Suzuki Takahashi Tanaka Taylor Thomas Thompson Torres Tran Turner Vargas
Vasquez Vu Wagner Walker Wang Ward Watanabe Weber Williams Wilson Wong Wright Wu Xu Yadav Yamamoto Yang Yilmaz Young
Zhang Zhao Zhou Zimmermann Zulu
Abe Achterberg Acosta Adeleke Adewale Aguirre Ahmadi Akande Al-Sayed Alvarado Amin Andrade Anwar Arslan Ashraf Aziz
Babatunde Bakker Balogun Barros Bauer Bhatt Bianco Blanco Bondarenko Bui Cabrera Calderon Camara Cardenas Carvalho
Castro Cohen Contreras Correia Cunha Dahl Dao Dawson Demir Dogan Duarte Dubois Dvorak Ekström Erdogan Escobar
Esposito Estrada Farah Fitzgerald Fonseca Fuentes Galli Gallo Garza Gauthier Ghosh Gomes Greco Guerrero Haddad
Halvorsen Hashemi Hassan Herrera Hosseini Huber Iyer Jaramillo Jovanovic Kaya Keller Kovacs Kowalczyk Kruger Kuznetsov
Lange Lindqvist Lombardi Luna Lund Macharia Mahlangu Marchetti Marino Medina Mejia Mendes Mensah Mishra Molina
Morozov Mukherjee Mwangi Nair Nakashima Ncube Ndlovu Neumann Nikolaidis Njoroge Noor Nkosi Nwosu Obasanjo Ochieng
Oduya Ogunbanjo Okoro Oliveira Omondi Onyango Orlov Ozturk Pacheco Papadopoulos Pavlov Peeters Pellegrini Pham
Pillai Pinto Rahimi Ramadan Rasmussen Reis Rezaei Ribeiro Rios Rocha Rojas Rubio Saeed Salazar Salem Sandoval Santana
Sato Sauer Schwarz Sen Serrano Siddiqui Sokolova Soto Sousa Srinivasan Stojanovic Suarez Sun Takeda Tan Teo Tiwari
Tkachenko Toure Trinh Ueda Usman Valdez Vega Verma Vieira Volkov Walsh Weiss Yamada Yeo Yildiz Yoon Yusuf Zamora
Zapata Zhu Zielinski
""".split())
